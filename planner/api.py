"""The steps of planner as library functions (exported from :mod:`planner`).

profile -> search -> plan -> judge -> simulate / compare -> export / run. Every step takes
values (:class:`~planner.ir.ModelProfile`, :class:`~planner.ir.Cluster`,
:class:`~planner.ir.Plan`) or, for convenience, the JSON file they are stored in (a
cluster also by preset name), and returns a value; the CLI commands are thin shells over
the same library code.

``profile_model``, ``export_plan`` and ``run_plan`` need torch (``pip install
'planner[torch]'``; ``run_plan`` with DeepSpeed ``'planner[engines]'``) and import it only
when called: ``import planner`` never imports torch, so a light install searches,
simulates and compares from JSON. The names carry their object (``search_plan``, not
``search``) because ``planner.search``, ``planner.simulate``, ``planner.compare`` and
``planner.export`` are the subpackages that hold the algorithms.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from planner import ir
from planner.errors import PlannerError, UsageError

if TYPE_CHECKING:
    from planner.compare import Comparison
    from planner.judge import Judged
    from planner.simulate import SimOptions, SimResult

ProfileLike = ir.ModelProfile | str | Path
ClusterLike = ir.Cluster | str
PlanLike = ir.Plan | str | Path
_V = TypeVar("_V", ir.ModelProfile, ir.Cluster, ir.Plan)


def load_profile(profile: ProfileLike) -> ir.ModelProfile:
    """A profile value, or the profile JSON file at that path, validated."""
    if isinstance(profile, ir.ModelProfile):
        return _checked(profile, ir.ModelProfile.from_dict, "profile")
    from planner.jsonio import read_json

    return ir.ModelProfile.from_dict(read_json(_path(profile, "profile", "ModelProfile"), "profile"), str(profile))


def load_plan(plan: PlanLike) -> ir.Plan:
    """A plan value, or the plan JSON file at that path, validated and checked (planner.consistency;
    its warnings as Python warnings)."""
    if isinstance(plan, ir.Plan):
        return _checked(plan, ir.Plan.from_dict, "plan")
    import warnings

    from planner.consistency import load_plan as load_checked

    value, found = load_checked(_path(plan, "plan", "Plan"))
    for warning in found:
        warnings.warn(warning, stacklevel=2)
    return value


def _cluster(cluster: ClusterLike) -> ir.Cluster:
    from planner.cluster import load_cluster

    if isinstance(cluster, ir.Cluster):
        return _checked(cluster, ir.Cluster.from_dict, "cluster")
    return load_cluster(_path(cluster, "cluster", "Cluster", " or a preset's name"))


def _checked(value: _V, read: Callable[[dict[str, Any], str], object], kind: str) -> _V:
    """``value`` (built in Python, not read from a file) after the rules its JSON document obeys: its
    document checked as :func:`planner.jsonio.read_json` checks a file (finite numbers, the shipped schema's
    bounds) and read back by ``read`` (the type's ``from_dict``), and a plan's fields against each other
    (:func:`planner.consistency.check_plan`), so a hand-built GPU with negative FLOP/s or 1e-300 FLOP/s, or a stage
    with ZeRO 7, is a FormatError naming the field, as in a file."""
    from planner import schemas
    from planner.jsonio import check_finite

    where = f"{kind} value"
    try:
        doc = value.to_dict()
    except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:
        raise UsageError(f"the {kind} value has a malformed field ({exc})",
                         f"build it with planner.ir.{type(value).__name__}.from_dict(doc), which names the field") \
            from None
    check_finite(doc, where)
    schemas.validate(doc, kind, doc["version"], where)
    read(doc, where)
    if isinstance(value, ir.Plan):
        from planner.consistency import check_plan

        check_plan(doc, value, where)
    return value


def _path(value: object, kind: str, value_type: str, more: str = "") -> str:
    """``value`` as the path of a JSON file of ``kind``; UsageError naming what it is otherwise."""
    if isinstance(value, (str, PathLike)):
        if "\0" in str(value):
            raise UsageError(f"the {kind} path {str(value)!r:.80} holds a NUL character", "pass the file's path")
        return str(value)
    raise UsageError(f"a {kind} must be a planner.ir.{value_type} or the path of its JSON file{more}, got "
                     f"{type(value).__name__}", f"pass planner.ir.{value_type}.from_dict(doc) for a document in memory")


def _need(module: str, extra: str, step: str) -> None:
    """PlannerError naming the extra to install when ``module`` cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise PlannerError(f"{step} needs {module}, which is not installed",
                           f"pip install 'planner[{extra}]'") from None


def profile_model(model: str, *, batch_size: int = 32, mode: str = "measured",
                  input_shape: Sequence[int] | None = None, device: str = "cpu", dtype: str = "float32",
                  overrides: Mapping[str, Any] | None = None, **options: Any) -> ir.ModelProfile:
    """Profile ``model`` (a zoo name or ``package.module:factory``): per-layer times, FLOPs and
    bytes. ``mode`` ``measured`` times it on ``device``; ``analytic`` counts on the meta
    device. ``overrides`` set config fields of a zoo transformer (``planner profile --set``).
    ``options`` go to :func:`planner.profiler.profile_model` (threads, repeats, warmup,
    device_flops, efficiency, progress). Needs torch."""
    _need("torch", "torch", "profiling")
    from planner.profiler import load_model
    from planner.profiler import profile_model as run_profile

    shape = tuple(input_shape) if input_shape is not None else None
    loaded = load_model(model, batch_size, shape, dtype=dtype, device="meta" if mode == "analytic" else device,
                        overrides=overrides)
    return run_profile(loaded, mode=mode, **options)


def search_plan(profile: ProfileLike, cluster: ClusterLike, *, schedule: str = "1f1b",
                virtual_stages: int | None = None, candidates: int | None = None, memory_headroom: float = 0.0,
                **options: Any) -> ir.Plan:
    """The fastest plan that fits (planner.search; InfeasibleError when none does).

    ``virtual_stages`` (schedules that take them: default 2) chunks each device group
    (planner.search.interleave). ``candidates``: plans the simulator re-ranks (default
    planner.search.RERANK; 0: the analytic optimum). ``memory_headroom``: the share of every GPU's
    memory kept free (``--memory-headroom``: ``ir.Cluster.keeping_free``). ``options`` are
    planner.search.search's: microbatches, optimizer, solver, engine, config, progress, precision, tp,
    zero, recompute, micro_batch_size, alternatives."""
    from planner.search import RERANK, search

    rerank = RERANK if candidates is None else candidates
    return search(load_profile(profile), _headroom(cluster, memory_headroom), schedule=schedule, candidates=rerank,
                  virtual_stages=virtual_stages, **options)


def _headroom(cluster: ClusterLike, share: object) -> ir.Cluster:
    """The cluster with ``share`` of every GPU's memory kept free (a number in [0, ``MAX_HEADROOM``], as the CLI
    takes it)."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= ir.MAX_HEADROOM:
        raise UsageError(f"memory_headroom must be a number in [0, {ir.MAX_HEADROOM}], got {share!r:.40}",
                         "e.g. memory_headroom=0.1 plans within 90% of every GPU's memory")
    return _cluster(cluster).keeping_free(float(share))


def judge_plan(plan: PlanLike, *, recompute: bool = False) -> Judged:
    """``plan`` validated, simulated and given its memory verdict and prediction (planner.judge)."""
    from planner.judge import judge

    if not isinstance(recompute, bool):
        raise UsageError(f"recompute must be True or False, got {recompute!r:.40}",
                         "recompute=True retries overflowing stages with full recomputation")
    return judge(load_plan(plan), recompute=recompute)


def simulate_plan(plan: PlanLike, options: SimOptions | None = None) -> SimResult:
    """One training iteration of ``plan`` played event by event (planner.simulate)."""
    from planner.simulate import SimOptions, simulate

    if options is not None and not isinstance(options, SimOptions):
        raise UsageError(f"options must be a planner.simulate.SimOptions or None, got {type(options).__name__}",
                         "pass planner.simulate.SimOptions(overlap_allreduce=True, ...)")
    return simulate(load_plan(plan), options)


def compare_strategies(profile: ProfileLike, cluster: ClusterLike, *, memory_headroom: float = 0.0,
                       **options: Any) -> Comparison:
    """Every baseline and the planner's plan judged alike (planner.compare; ``options``:
    microbatches, schedule, optimizer, strategies, rerank; ``memory_headroom`` as :func:`search_plan`'s)."""
    from planner.compare import compare

    return compare(load_profile(profile), _headroom(cluster, memory_headroom), **options)


def export_plan(plan: PlanLike, engine: str, out_dir: str | Path) -> list[Path]:
    """Write a runnable training program for ``engine`` (deepspeed or torch) into ``out_dir``
    (planner.export); the files written. Needs torch."""
    _need("torch", "torch", "export")
    from planner.export.program import export_plan as write_program

    if not isinstance(out_dir, (str, PathLike)):
        raise UsageError(f"out_dir must be a folder's path, got {type(out_dir).__name__}", 'e.g. out_dir="out/"')
    return write_program(load_plan(plan), engine, out_dir)


def run_plan(plan: PlanLike, model: str, *, engine: str | None = None, **options: Any) -> dict[str, Any]:
    """Train ``plan`` for real under torchrun and measure it beside its prediction
    (planner.runner; ``options``: steps, warmup, loss, check, seed, threads, timeout_s), on ``engine`` (None: the
    one the plan was searched for, :func:`planner.engines.run_engine`).
    Needs torch, and DeepSpeed for ``engine="deepspeed"`` (``'planner[engines]'``)."""
    _need("torch", "torch", "running a plan")
    from planner.engines import run_engine
    from planner.runner import run_plan as train

    loaded = load_plan(plan)
    return train(loaded, model, engine=engine or run_engine(loaded), **options)
