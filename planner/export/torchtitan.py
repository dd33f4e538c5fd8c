"""Plan -> torchtitan job config (TOML) for Llama-family plans.

Written for torchtitan 0.2.0's ``JobConfig`` (``torchtitan/config/job_config.py``), the last
release whose config loader reads TOML (``--job.config_file``); torchtitan 0.3.0 replaced TOML
files by Python config registries (``--module``/``--config``). :data:`SCHEMA` lists every key
written, with its type in that schema; tests/test_export_torchtitan.py holds the file to it (and
to torchtitan's own loader where that is importable).

What maps (``[parallelism]``): ``pipeline_parallel_degree`` = K, ``tensor_parallel_degree`` =
tp, data parallelism per the plan's ZeRO stage (0: ``data_parallel_replicate_degree`` = dp, DDP;
2: ``data_parallel_shard_degree`` = dp with ``fsdp_reshard_after_forward = "never"``; 3: the same
with ``"always"``), ``module_fqns_per_model_part`` = the plan's stages (uneven stages and
interleaved chunks as explicit module lists: ``tok_embeddings``, ``layers.i``, ``norm`` +
``output``), ``pipeline_parallel_schedule``, ``pipeline_parallel_microbatch_size`` = the plan's
per-rank micro-batch; ``[training]`` local (per data-parallel rank: its batch with a pipeline, one
micro-batch without, which torchtitan accumulates; :func:`local_batch_size`) and global batch, sequence
length, ``mixed_precision_param`` (bf16: bfloat16 parameters in FSDP's policy, or autocast
under DDP, as torchtitan runs them; fp32 master weights either way); ``[activation_checkpoint] mode`` none or full
(torchtitan's full mode checkpoints each block: each block's input is kept and the blocks are
redone, the norm and output not, as the plan's cost counts: ``ModelProfile.blockwise_recompute``).

Launch: on one server ``torchrun --nproc_per_node W -m torchtitan.train --job.config_file
job_config.toml``; on several, the torch export's ``launch_node<R>.sh`` per server (torchrun's
``--nnodes``, ``--node-rank``, ``--nproc-per-node`` and static rendezvous;
:func:`planner.export.program.launch_scripts`) starting torchtitan's trainer instead of ``train.py``.

What torchtitan cannot express is refused (ExportError with the reason, from planner.runnable's
torchtitan limits, which the search honours): ZeRO-1 (torchtitan shards with FSDP or
replicates), selective recomputation (torchtitan's selective modes are per-op SAC, which saves
matrix products and attention outputs and recomputes the rest, or every n-th layer, not the
attention core only), fp16 (``mixed_precision_param`` is bfloat16 or float32), tensor
parallelism without sequence parallelism (torchtitan's Llama always shards norms over the
sequence under tp), transformer blocks in a tensor group without the ``tp`` form (torchtitan
shards every block Megatron-style), stages that differ in recomputation, optimizers but Adam (torchtitan
builds Adam or AdamW only), and models that are not Llama-family (gated-MLP blocks between one embedding and
one head). ``[model] flavor`` is torchtitan's flavor only where it builds the plan's model to the FFN width and
vocabulary (:data:`FLAVORS`); else ``planner``, with the ``TransformerModelArgs`` to register (:func:`ffn_args`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from planner import ir, runnable
from planner.errors import ExportError, PlanError
from planner.export.nodes import NodeLayout
from planner.export.program import launch_scripts as torchrun_scripts
from planner.export.program import plan_layout, server_commands
from planner.export.quoting import one_line, toml_string
from planner.jsonio import dumps

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb-h1": "InterleavedZeroBubble"}
"""The plan's schedule -> torchtitan's ``pipeline_parallel_schedule`` (torch's schedule class names)."""

FLAVORS = {(256, 6, 16, 16, 768, 2048): "debugmodel", (4096, 32, 32, 8, 14336, 128256): "8B",
           (8192, 80, 64, 8, 28672, 128256): "70B", (16384, 126, 128, 8, 53248, 128256): "405B"}
"""torchtitan 0.2.0's llama3 flavors (``llama3_args`` in torchtitan/models/llama3/__init__.py) by (dim, layers, heads,
KV heads, FFN width, vocabulary): the model it builds for the flavor, which must be the plan's to the last weight."""

DEFAULT_MULTIPLE_OF = 256
"""``TransformerModelArgs.multiple_of``'s default (torchtitan/models/llama3/model/args.py)."""


def titan_ffn(dim: int, multiple_of: int = DEFAULT_MULTIPLE_OF, ffn_dim_multiplier: float | None = None) -> int:
    """The FFN width torchtitan's Llama ``FeedForward`` builds (torchtitan/models/llama3/model/model.py): two thirds
    of ``4 * dim``, times ``ffn_dim_multiplier``, rounded up to a multiple of ``multiple_of``."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def ffn_args(dim: int, ffn: int) -> dict[str, int | float]:
    """``multiple_of`` and ``ffn_dim_multiplier`` with which torchtitan builds an FFN ``ffn`` wide (none where its
    defaults do): ``ffn`` as the multiple, and a multiplier (six decimals) that takes two thirds of ``4 * dim`` to
    ``ffn`` and a half, which ``int()`` cuts to ``ffn``."""
    if titan_ffn(dim) == ffn:
        return {}
    return {"multiple_of": ffn, "ffn_dim_multiplier": round((ffn + 0.5) / int(2 * (4 * dim) / 3), 6)}

SCHEMA: dict[str, dict[str, type]] = {
    "job": {"description": str, "dump_folder": str},
    "model": {"name": str, "flavor": str},
    "optimizer": {"name": str, "lr": float},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int, "steps": int,
                 "mixed_precision_param": str, "mixed_precision_reduce": str, "max_norm": float},
    "parallelism": {"pipeline_parallel_degree": int, "tensor_parallel_degree": int,
                    "data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "fsdp_reshard_after_forward": str, "module_fqns_per_model_part": list,
                    "pipeline_parallel_schedule": str, "pipeline_parallel_microbatch_size": int},
    "activation_checkpoint": {"mode": str},
}
"""Every key :func:`job_config` writes, with its type in torchtitan 0.2.0's JobConfig."""



def check_plan(plan: ir.Plan) -> int:
    """Refuse what torchtitan cannot express; return the data-parallel degree."""
    try:
        runnable.check_runnable(plan, "torchtitan")
    except PlanError as exc:
        raise ExportError(exc.cause, exc.hint) from None
    return plan.stages[0].dp


def _layer_fqns(profile: ir.ModelProfile) -> list[list[str]]:
    """torchtitan's Llama modules for each profiled layer: embedding, blocks, final norm with the head."""
    family = runnable.llama_problem(profile)
    if family is not None:
        raise ExportError(family, "torchtitan trains its own model definitions: export --to torch or deepspeed")
    blocks = sum(lp.block is not None for lp in profile.layers)
    return [["tok_embeddings"], *([f"layers.{k}"] for k in range(blocks)), ["norm", "output"]]


def module_fqns(plan: ir.Plan) -> list[list[str]]:
    """The module names of each model part (stage, or chunk of an interleaved plan)."""
    per_layer = _layer_fqns(plan.profile)
    return [[fqn for i in range(*st.layers) for fqn in per_layer[i]] for st in plan.stages]


def vocabulary(profile: ir.ModelProfile) -> int:
    """The model's vocabulary: its embedding's rows (``in_features`` where the profile has the weight's shape, else
    its parameters over the width)."""
    blk, embedding = next(lp.block for lp in profile.layers if lp.block is not None), profile.layers[0]
    return int(embedding.in_features or embedding.param_count // blk.hidden)


def _flavor(profile: ir.ModelProfile) -> tuple[str, str]:
    """torchtitan's flavor for the model's shape ("planner" if it has none) and the model args that build it."""
    shapes = [lp.block for lp in profile.layers if lp.block is not None]
    blk, n, vocab = shapes[0], len(shapes), vocabulary(profile)
    args: dict[str, int | float] = {"dim": blk.hidden, "n_layers": n, "n_heads": blk.heads,
                                    "n_kv_heads": blk.kv_heads, "vocab_size": vocab, **ffn_args(blk.hidden, blk.ffn)}
    text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return FLAVORS.get((blk.hidden, n, blk.heads, blk.kv_heads, blk.ffn, vocab), "planner"), text


def _data_parallel(stage: ir.Stage) -> dict[str, Any]:
    if stage.zero == 0:
        return {"data_parallel_replicate_degree": stage.dp, "data_parallel_shard_degree": 1}
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": stage.dp,
            "fsdp_reshard_after_forward": "always" if stage.zero == 3 else "never"}


def local_batch_size(plan: ir.Plan, dp: int) -> int:
    """torchtitan's ``local_batch_size``: a pipeline's whole batch per data-parallel rank, which its
    schedule cuts into the plan's micro-batches; without a pipeline (K = 1) one micro-batch, so that
    torchtitan accumulates the plan's M of them (its ``gradient_accumulation_steps`` =
    ``global_batch_size // (local_batch_size * dp)``; torchtitan/train.py) rather than running the
    rank's whole batch at once with M times the activations the plan counts."""
    if plan.pipeline_stages > 1:
        return plan.batch_size // dp
    return int(plan.micro_batch_size(plan.stages[0]))


def job_config(plan: ir.Plan, steps: int = 10, lr: float = 8e-4) -> dict[str, dict[str, Any]]:
    """The job config as nested sections (see :data:`SCHEMA`)."""
    dp = check_plan(plan)
    first = plan.stages[0]
    flavor, _ = _flavor(plan.profile)
    seq_len = next(lp.block.seq_len for lp in plan.profile.layers if lp.block is not None)
    return {
        "job": {"description": f"planner plan {plan.config} for {one_line(plan.model)}", "dump_folder": "./outputs"},
        "model": {"name": "llama3", "flavor": flavor},
        "optimizer": {"name": "AdamW", "lr": lr},
        "training": {"local_batch_size": local_batch_size(plan, dp), "global_batch_size": plan.batch_size,
                     "seq_len": seq_len, "steps": steps, "max_norm": 1.0,
                     "mixed_precision_param": "bfloat16" if plan.precision == "bf16" else "float32",
                     "mixed_precision_reduce": "float32"},
        "parallelism": {"pipeline_parallel_degree": plan.pipeline_stages, "tensor_parallel_degree": first.tp,
                        **_data_parallel(first), "module_fqns_per_model_part": module_fqns(plan),
                        "pipeline_parallel_schedule": SCHEDULES[plan.schedule],
                        "pipeline_parallel_microbatch_size": int(plan.micro_batch_size(first))},
        "activation_checkpoint": {"mode": first.recompute},
    }


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return toml_string(v)
    return "[" + ", ".join(_value(x) for x in v) + "]"


def toml_text(doc: Mapping[str, Mapping[str, Any]], header: str = "") -> str:
    """TOML of sections of scalars and (nested) lists: what :func:`job_config` returns (strings escaped; the
    header's lines as comments, each one printable line)."""
    lines = [f"# {one_line(ln)}" for ln in header.splitlines()]
    for section, values in doc.items():
        lines += ["", f"[{section}]", *(f"{k} = {_value(v)}" for k, v in values.items())]
    return "\n".join(lines).lstrip("\n") + "\n"


def config_text(plan: ir.Plan) -> str:
    """The job config file for ``plan`` with a header saying what to fill in."""
    doc = job_config(plan)
    flavor, args = _flavor(plan.profile)
    note = "" if flavor != "planner" else (
        f"\nflavor 'planner' is not one of torchtitan's: register llama3_args['planner'] = "
        f"TransformerModelArgs({args}) in torchtitan/models/llama3/__init__.py (rope_theta and norm_eps as your "
        "model's)")
    return toml_text(doc, "torchtitan 0.2.0 job config written by `planner export --to torchtitan` "
                          f"(plan {plan.config}, {plan.schedule}, {plan.microbatches} micro-batches).\n"
                          "Set [model] hf_assets_path (tokenizer) and [training] dataset for your data." + note)


ENTRY = "-m torchtitan.train --job.config_file job_config.toml"
"""What torchrun starts on every server: torchtitan's trainer with the exported job config."""


def servers(plan: ir.Plan) -> tuple[NodeLayout | None, str]:
    """The plan's servers when it spans several (None on one), or None and why torchrun cannot start it
    server by server (:func:`planner.export.program.plan_layout`)."""
    layout, why = plan_layout(plan)
    return (layout if layout is not None and layout.nnodes > 1 else None), why


def launch_command(plan: ir.Plan, out_dir: str) -> str:
    """torchtitan's own launch of the job config on one server (every rank on this machine)."""
    command = f"torchrun --nproc_per_node {plan.world_size} {ENTRY}"
    return command if out_dir == "." else f"cd {shlex.quote(out_dir)} && {command}"


def launch_scripts(plan: ir.Plan) -> dict[str, str]:
    """``launch_node<R>.sh`` per server of a plan on several servers (none on one): the torch export's
    scripts (:func:`planner.export.program.launch_scripts`: ``--nnodes``, ``--node-rank``,
    ``--nproc-per-node``, static rendezvous at ``$1`` or ``$RDZV_ENDPOINT``) starting torchtitan's
    trainer instead of ``train.py``; extra arguments go to torchtitan (e.g. ``--training.steps 20``)."""
    layout, _ = servers(plan)
    if layout is None:
        return {}
    return torchrun_scripts(plan, layout, ENTRY, "torchtitan")


def launch_commands(plan: ir.Plan, out_dir: str) -> list[str]:
    """What to run after export: one torchrun on one server, else each server's launch script."""
    if servers(plan)[0] is None:
        return [launch_command(plan, out_dir)]
    return server_commands(plan, out_dir)


def _launch_text(plan: ir.Plan) -> str:
    """The README's launch section: the command, or the servers and their scripts."""
    layout, why = servers(plan)
    if layout is None:
        note = f"\nThe plan cannot be started server by server: {one_line(why)}.\n" if why else ""
        return f"```\n{launch_command(plan, '.')}\n```\n{note}"
    scripts = "\n".join(f"sh launch_node{r}.sh HOST:PORT   # on server {one_line(s)}"
                         for r, s in enumerate(layout.servers))
    return (f"The plan runs on {layout.nnodes} servers ({', '.join(map(one_line, layout.servers))}), "
            f"{layout.nproc_per_node} processes each: start `launch_node<R>.sh` on server R with node rank 0's "
            f"address and a free port (the same on every server).\n\n```\n{scripts}\n```\n")


def _register_note(plan: ir.Plan) -> str:
    """The README's note on a model that is none of torchtitan's flavors (nothing for one that is)."""
    flavor, args = _flavor(plan.profile)
    if flavor != "planner":
        return ""
    return (f" The model is none of torchtitan's llama3 flavors: add `llama3_args['planner'] = "
            f"TransformerModelArgs({args})` to `torchtitan/models/llama3/__init__.py` (job_config.toml says so too).")


def files(plan: ir.Plan) -> dict[str, str]:
    """The export folder: the plan, the job config, a launch script per server (several servers) and a
    README with the commands."""
    check_plan(plan)  # before the README, which reads the model's blocks
    readme = (f"# {one_line(plan.model)} on torchtitan: config {plan.config}, {plan.schedule}, {plan.microbatches} "
              f"micro-batches\n\nExported by `planner export --to torchtitan` for torchtitan 0.2.0 (TOML job "
              f"configs). Predicted iteration: {plan.predicted.iteration_s:.6g} s.\n\n{_launch_text(plan)}\n"
              "Set `[model] hf_assets_path` (the tokenizer) and `[training] dataset` to your data first."
              f"{_register_note(plan)}\n")
    return {"plan.json": dumps(plan.to_dict()), "job_config.toml": config_text(plan), **launch_scripts(plan),
            "README.md": readme}
