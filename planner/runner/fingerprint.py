"""``planner run --check``'s second test: the trained weights against the unsplit model's, parameter by parameter.

The losses alone let small gradient bugs through: a tie whose gradient one interleaved chunk divided twice moved the
loss by 6e-6 relative after three steps, inside the fp32 bound of 1e-5; a tie's gradient scaled by 0.97 in a 2-stage
GPT-2 (momentum SGD) moved the losses by 7.6e-6 and the tied weight by 0.020 of its update; a frozen norm trained
under sequence parallelism moved them by 3.4e-6. So each worker, after the timed steps, projects every parameter of
the layers it runs on a fixed random direction (:func:`fingerprints`: the dot product with a standard normal vector
seeded by the parameter's key, ``"<layer index>.<parameter name>"``, in float64), whole: a tensor-parallel or ZeRO-3
shard is gathered first (``DTensor.full_tensor``), and a GPT-2 ``Conv1D`` that tensor parallelism rewrote as an
``nn.Linear`` with its fused q/k/v rows reordered (:mod:`planner.export.parallel`) is read back in the model's own
layout. The reference (:mod:`planner.runner.reference`) projects its own weights the same way, and how far each
moved in the steps (``|w_end - w_start|``, the update's norm).

For a difference ``d`` of two weights the projection's difference is a normal of standard deviation ``|d|``,
so ``|p_plan - p_ref| / |update|`` reads as the weight's error relative to its update (:func:`weight_check`;
within a factor of about 3 either way: one draw of a normal). A rank whose
data-parallel replica drifted from the others is caught the same way: every rank reports its copy.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from planner.export.parallel import CONV1D_ROWS

CHUNK = 1 << 22
"""Elements projected at a time: a parameter's direction is drawn and its values widened to float64 a chunk at a
time (32 MiB each), not whole (a 128k x 4096 embedding would take 8 GiB of float64 twice over on every rank)."""


def project(key: str, value: torch.Tensor) -> float:
    """``value`` (flattened) dotted with the fixed standard normal vector of ``key`` (the same in every process:
    drawn from a generator seeded by the key, :data:`CHUNK` values at a time), in float64."""
    gen = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    flat = value.reshape(-1)
    total = 0.0
    for first in range(0, flat.numel(), CHUNK):
        part = flat[first:first + CHUNK].to(torch.float64)
        total += float(part @ torch.randn(part.numel(), generator=gen, dtype=torch.float64))
    return total


def whole(param: torch.Tensor) -> torch.Tensor:
    """The parameter's full value on this rank's CPU: a DTensor gathered over its mesh (every rank of that mesh
    must call this for the same parameters in the same order)."""
    full = param.full_tensor() if hasattr(param, "full_tensor") else param
    return full.detach().to("cpu")


def model_layout(module: nn.Module, name: str, value: torch.Tensor) -> torch.Tensor:
    """``value`` of ``module``'s own parameter ``name`` in the layout the model was built with: a Linear made of
    a Conv1D (weight ``[out, in]`` with permuted rows) back to ``[in, out]`` in the original order."""
    rows = getattr(module, CONV1D_ROWS, None)
    if rows is None:
        return value
    back = torch.argsort(rows)
    return value[back].t() if name == "weight" else value[back]


def _named(index: int, layer: nn.Module) -> Iterable[tuple[str, nn.Module, str, torch.Tensor]]:
    """Every parameter of the layer as (key, its module, its name there, the parameter), in module order."""
    for mod_name, module in layer.named_modules():
        for name, param in module.named_parameters(recurse=False):
            yield f"{index}.{mod_name + '.' if mod_name else ''}{name}", module, name, param


def layer_values(index: int, layer: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """Every parameter of the layer as (key, full value in the model's layout), in module order."""
    for key, module, name, param in _named(index, layer):
        yield key, model_layout(module, name, whole(param))


def gradient_norms(layers: Sequence[nn.Module]) -> dict[str, float]:
    """The norm of every parameter's gradient now, by key: those that have one (the reference, after a step's
    backward passes)."""
    return {key: float(torch.linalg.vector_norm(param.grad.detach().double()))
            for i, layer in enumerate(layers) for key, _, _, param in _named(i, layer) if param.grad is not None}


GRAD_NOISE = 1e-7
"""A parameter whose gradient in one process never exceeds this share of the model's largest gradient (in any step;
fp32's epsilon, 1.2e-7: the model's own sums are rounded at that share) but is not 0 is rounding noise: its exact
gradient is 0 (a key bias, which softmax ignores) and fp32 sums it to a few ulps of the terms that cancel in it, in
an order a split plan changes. Adam divides it by its own root mean square, moving it as far as any weight, in a
direction the rounding sets (ViT's key bias, ZeRO-2 over 2 replicas, Adam: 4.8e-2 of its update off, the losses
2e-8): such a parameter is compared but not judged. Measured (Adam, 3 steps): the key biases of ViT, BERT and OPT
at 1e-12 to 1.4e-10 of the largest gradient; the smallest real gradient, BERT's query bias, at 4e-6."""


def noise_keys(steps: Sequence[Mapping[str, float]]) -> frozenset[str]:
    """The keys whose gradient was rounding noise in every step (:data:`GRAD_NOISE`), from
    :func:`gradient_norms` of each step."""
    largest = max((v for step in steps for v in step.values()), default=0.0)
    peak: dict[str, float] = {}
    for step in steps:
        for key, value in step.items():
            peak[key] = max(peak.get(key, 0.0), value)
    return frozenset(k for k, v in peak.items() if 0.0 < v <= GRAD_NOISE * largest)


def fingerprints(layers: Sequence[nn.Module], indices: Iterable[int]) -> dict[str, float]:
    """The projections of the parameters of ``layers[i]`` for each ``i`` in ``indices`` (module doc)."""
    out = {}
    for i in indices:
        for key, value in layer_values(i, layers[i]):
            out[key] = project(key, value)
    return out


@dataclass(frozen=True)
class Reference:
    """The unsplit model's side: its projections after the steps, how far each parameter moved in them, and the
    parameters whose gradient was rounding noise (:func:`noise_keys`)."""

    projections: Mapping[str, float]
    update_norms: Mapping[str, float]
    noise: frozenset[str] = frozenset()


def starting_values(layers: Sequence[nn.Module]) -> dict[str, torch.Tensor]:
    """Every parameter's value before training (copies), by key."""
    return {key: value.clone() for i, layer in enumerate(layers) for key, value in layer_values(i, layer)}


def reference(layers: Sequence[nn.Module], start: Mapping[str, torch.Tensor],
              noise: frozenset[str] = frozenset()) -> Reference:
    """The trained reference's :class:`Reference`, against its ``start`` (:func:`starting_values`)."""
    proj, norms = {}, {}
    for i, layer in enumerate(layers):
        for key, value in layer_values(i, layer):
            proj[key] = project(key, value)
            norms[key] = float(torch.linalg.vector_norm(value.double() - start[key].double()))
    return Reference(proj, norms, noise)


@dataclass(frozen=True)
class WeightCheck:
    """How far the plan's weights are from the reference's, relative to how far the reference's moved.

    ``max_rel_diff``: over every parameter compared, on every rank that holds it, the projection's difference
    over the parameter's update norm, or over :data:`SMALL_UPDATE` of the largest update of any parameter where
    that is larger (a frozen parameter, or one whose gradient is rounding noise); None where a weight is not
    finite.
    ``worst``: that parameter's key; ``compared`` / ``missing``: how many keys the workers reported that the
    reference has, and the reference's keys no worker reported; ``unjudged``: the keys compared whose gradient was
    rounding noise in one process (:data:`GRAD_NOISE`), left out of ``max_rel_diff`` where finite."""

    max_rel_diff: float | None
    worst: str
    compared: int
    missing: tuple[str, ...]
    unjudged: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """The run JSON's keys (docs/contracts.md): ``max_rel_weight_diff``, ``worst_weight``,
        ``weights_compared``, ``weights_missing``, ``weights_unjudged``."""
        return {"max_rel_weight_diff": self.max_rel_diff, "worst_weight": self.worst,
                "weights_compared": self.compared, "weights_missing": list(self.missing),
                "weights_unjudged": list(self.unjudged)}


SMALL_UPDATE = 1e-3
"""A parameter's difference is judged against its own update, or against this share of the model's largest update
where its own is smaller: a parameter whose gradient is rounding noise (BERT's key bias, which softmax ignores, moved
by 1e-12 in one process and as little, otherwise, in the plan: 2.8 of its own update) or nothing (frozen)."""


def _relative(got: float, ref: Reference, key: str, largest_update: float) -> float:
    scale = max(ref.update_norms[key], SMALL_UPDATE * largest_update, 1e-30)
    return abs(got - ref.projections[key]) / scale


def weight_check(reported: Mapping[str, Sequence[float]], ref: Reference) -> WeightCheck:
    """Judge the workers' projections (every rank's copy of each key) against the reference's."""
    largest = max(ref.update_norms.values(), default=0.0)
    worst: float | None = 0.0
    worst_key, compared, unjudged = "", 0, []
    for key, values in sorted(reported.items()):
        if key not in ref.projections:
            continue
        compared += 1
        rels = [_relative(v, ref, key, largest) for v in values]
        rel = max(rels, default=0.0) if all(math.isfinite(r) for r in rels) else math.inf
        if key in ref.noise and math.isfinite(rel):
            unjudged.append(key)
        elif worst is not None and not rel <= worst:
            worst, worst_key = (rel if math.isfinite(rel) else None), key
    missing = tuple(k for k in ref.projections if k not in reported)
    return WeightCheck(worst, worst_key, compared, missing, tuple(unjudged))


def read_check(doc: Mapping[str, object]) -> WeightCheck | None:
    """:meth:`WeightCheck.to_dict`'s keys read back from a run document (None where it has none)."""
    if "weights_compared" not in doc:
        return None
    diff = doc.get("max_rel_weight_diff")
    missing, unjudged = doc.get("weights_missing"), doc.get("weights_unjudged")
    compared = doc["weights_compared"]
    return WeightCheck(float(diff) if isinstance(diff, (int, float)) else None, str(doc.get("worst_weight", "")),
                       compared if isinstance(compared, int) else 0,
                       tuple(str(k) for k in missing) if isinstance(missing, list) else (),
                       tuple(str(k) for k in unjudged) if isinstance(unjudged, list) else ())


def merge(per_rank: Sequence[Mapping[str, float]]) -> dict[str, list[float]]:
    """Every rank's projections as one map of key to the values the ranks holding it reported."""
    out: dict[str, list[float]] = {}
    for values in per_rank:
        for key, value in values.items():
            out.setdefault(key, []).append(value)
    return out
