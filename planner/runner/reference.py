"""``planner run --check``: the unsplit model trained in this process on the same micro-batches.

The same initial weights (the same seed), the same data, micro-batch by micro-batch (so that
batch-norm sees the same samples), the mean loss, one optimizer step per batch, in the plan's
precision (a bf16 plan in bf16 casts of the fp32 weights, one per step, as the torch export computes:
planner.export.sharding.Bf16Compute): the losses a correct pipeline must reproduce (DESIGN.md
section 5: to 1e-5 relative in fp32). Against fp32 training a bf16 plan departed by rounding alone:
the zoo MLP with Adam on one device, nothing split, by 2.5e-3.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from planner import ir
from planner.errors import RunError
from planner.export.data import DataSpec, sub_batch
from planner.export.layers import disable_dropout
from planner.export.losses import make_loss
from planner.export.optim import DEFAULT_LR, torch_optimizer
from planner.export.sharding import casts_per_step, with_precision
from planner.runner import fingerprint
from planner.runner.fingerprint import Reference, WeightCheck


def reference_losses(layers: tuple[nn.Module, ...], plan: ir.Plan, spec: DataSpec, steps: int, seed: int,
                     width: int, lr: float | None = None) -> list[float]:
    """Train the unsplit model in this process: the same micro-batches, mean loss, one step per batch, computed
    in the plan's precision (module doc)."""
    return _train(layers, plan, spec, steps, seed, width, lr)


def reference_run(layers: tuple[nn.Module, ...], plan: ir.Plan, spec: DataSpec, steps: int, seed: int,
                  width: int) -> tuple[list[float], Reference]:
    """:func:`reference_losses`, and the trained weights' projections and updates (planner.runner.fingerprint)."""
    start = fingerprint.starting_values(layers)
    grads: list[dict[str, float]] = []
    losses = _train(layers, plan, spec, steps, seed, width, None,
                    lambda: grads.append(fingerprint.gradient_norms(layers)))
    return losses, fingerprint.reference(layers, start, fingerprint.noise_keys(grads))


def _train(layers: tuple[nn.Module, ...], plan: ir.Plan, spec: DataSpec, steps: int, seed: int, width: int,
           lr: float | None, on_gradients: Callable[[], None] = lambda: None) -> list[float]:
    disable_dropout(nn.Sequential(*layers))
    model = with_precision(nn.Sequential(*layers), plan.precision).train()
    loss_fn = make_loss(spec.loss)
    params = list({id(p): p for p in model.parameters()}.values())
    opt = torch_optimizer(plan.optimizer, params, DEFAULT_LR[plan.optimizer] if lr is None else lr)
    m, pieces = plan.microbatches, plan.microbatches * width
    out = []
    for step in range(steps):
        x, y = spec.batch(step, plan.batch_size, seed)
        opt.zero_grad()
        total = 0.0
        with casts_per_step([model]):
            for mb in range(m):
                for w in range(width):
                    loss = loss_fn(model(sub_batch(x, mb, w, m, width)), sub_batch(y, mb, w, m, width))
                    (loss / pieces).backward()
                    total += float(loss.detach())
        on_gradients()  # the step's gradients, summed
        opt.step()
        out.append(total / pieces)
    return out


CHECK_RTOL = {"fp32": 1e-5, "bf16": 1e-3}
"""How far a plan's losses may depart from the reference's, relative, by the plan's precision (DESIGN.md
section 5; bf16 as the README's tested bound). fp16 is not judged: its loss scaling skips the steps that overflow."""

WEIGHT_RTOL = {"fp32": 1e-2}
"""How far a plan's trained weights may be from the reference's, relative to how far the reference's moved
(:mod:`planner.runner.fingerprint`), fp32 plans only (bf16 and fp16 are rounded more than that: reported, not
judged). Measured on correct plans, 3 steps: momentum SGD 2e-6 to 2.7e-5 (17 grids of the tied tiny GPT-2 on 4
processes, interleaved and zb-h1 with the tie across stages, ZeRO 1-3, recomputation, DeepSpeed; ten other model
families at tp 2, dp 2 and pp 2), Adam up to 5.5e-4 (GPT-2's fused q/k/v bias, whose key third is rounding noise
inside a parameter that is not: fingerprint.GRAD_NOISE). The bugs it catches where the losses passed: a frozen norm
trained under sequence parallelism (142 times this bound, the losses 3.4e-6 off) and a tie's gradient scaled by
0.97 with momentum SGD (0.020, the losses 7.6e-6 off)."""

_FIX = ("the plan does not train the model as one process does: see that the model's factory builds the same "
        "weights in every process (from torch's seeded generator) and has no randomness besides the dropouts and "
        "router noise runs switch off; else report it, with the plan and the model")


def check_failure(plan: ir.Plan, losses: list[float], reference: list[float],
                  weights: WeightCheck | None = None) -> RunError | None:
    """What ``planner run --check`` fails with (exit 1): losses that depart from single-process training by more
    than :data:`CHECK_RTOL` for the plan's precision, with the step that departs most, or trained weights further
    from its than :data:`WEIGHT_RTOL`, naming the weight. It warned, and exited 0."""
    rtol = CHECK_RTOL.get(plan.precision)
    diffs = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(losses, reference, strict=True)]
    if rtol is not None and diffs and max(diffs) > rtol:
        step = max(range(len(diffs)), key=diffs.__getitem__)
        return RunError(f"--check failed: the losses depart from single-process training by {diffs[step]:.3g} "
                        f"relative, more than {rtol:g} for {plan.precision} (step {step}: {losses[step]:.6g}, in one "
                        f"process {reference[step]:.6g})", _FIX)
    return _weight_failure(plan, weights)


def _weight_failure(plan: ir.Plan, weights: WeightCheck | None) -> RunError | None:
    wtol = WEIGHT_RTOL.get(plan.precision)
    if weights is None or wtol is None:
        return None
    diff = weights.max_rel_diff
    if weights.missing and diff is not None and diff <= wtol:
        layer, _, name = weights.missing[0].partition(".")
        more = f" and {len(weights.missing) - 1} more weights" if len(weights.missing) > 1 else ""
        return RunError(f"--check failed: no rank reported layer {layer}'s {name}{more} after the steps: the "
                        "trained weights were not all compared with single-process training's",
                        "report it, with the plan and the model: the ranks' layers name their parameters otherwise "
                        "than the model does")
    if diff is not None and diff <= wtol:
        return None
    layer, _, name = weights.worst.partition(".")
    how = "is not finite" if diff is None else (f"differs from single-process training's by {diff:.3g} of its "
                                                f"update, more than {wtol:g} for {plan.precision}")
    return RunError(f"--check failed: the losses agree, but after the steps layer {layer}'s {name} {how} (the "
                    "weights' projections, planner.runner.fingerprint)", _FIX)


def max_rel_diff(a: list[float], b: list[float]) -> float:
    """The largest relative difference of two loss curves (``b`` the reference)."""
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))
