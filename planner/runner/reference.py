"""``planner run --check``: the unsplit model trained in this process on the same micro-batches.

The same initial weights (the same seed), the same data, micro-batch by micro-batch (so that
batch-norm sees the same samples), the mean loss, one optimizer step per batch, in the plan's
precision (a bf16 plan in bf16 casts of the fp32 weights, one per step, as the torch export computes:
planner.export.sharding.Bf16Compute): the losses a correct pipeline must reproduce (DESIGN.md
section 5: to 1e-5 relative in fp32). Against fp32 training a bf16 plan departed by rounding alone:
the zoo MLP with Adam on one device, nothing split, by 2.5e-3.
"""

from __future__ import annotations

from torch import nn

from planner import ir
from planner.errors import RunError
from planner.export.data import DataSpec, sub_batch
from planner.export.layers import disable_dropout
from planner.export.losses import make_loss
from planner.export.optim import DEFAULT_LR, torch_optimizer
from planner.export.sharding import casts_per_step, with_precision


def reference_losses(layers: tuple[nn.Module, ...], plan: ir.Plan, spec: DataSpec, steps: int, seed: int,
                     width: int, lr: float | None = None) -> list[float]:
    """Train the unsplit model in this process: the same micro-batches, mean loss, one step per batch, computed
    in the plan's precision (module doc)."""
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
        opt.step()
        out.append(total / pieces)
    return out


CHECK_RTOL = {"fp32": 1e-5, "bf16": 1e-3}
"""How far a plan's losses may depart from the reference's, relative, by the plan's precision (DESIGN.md
section 5; bf16 as the README's tested bound). fp16 is not judged: its loss scaling skips the steps that overflow."""


def check_failure(plan: ir.Plan, losses: list[float], reference: list[float]) -> RunError | None:
    """What ``planner run --check`` fails with (exit 1): losses that depart from single-process training by more
    than :data:`CHECK_RTOL` for the plan's precision, with the step that departs most. It warned, and exited 0."""
    rtol = CHECK_RTOL.get(plan.precision)
    diffs = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(losses, reference, strict=True)]
    if rtol is None or not diffs or max(diffs) <= rtol:
        return None
    step = max(range(len(diffs)), key=diffs.__getitem__)
    return RunError(f"--check failed: the losses depart from single-process training by {diffs[step]:.3g} relative, "
                    f"more than {rtol:g} for {plan.precision} (step {step}: {losses[step]:.6g}, in one process "
                    f"{reference[step]:.6g})",
                    "the plan does not train the model as one process does: see that the model's factory builds "
                    "the same weights in every process (from torch's seeded generator) and has no randomness "
                    "besides the dropouts and router noise runs switch off; else report it, with the plan and the "
                    "model")


def max_rel_diff(a: list[float], b: list[float]) -> float:
    """The largest relative difference of two loss curves (``b`` the reference)."""
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))
