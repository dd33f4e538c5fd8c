"""``planner run --check``: the unsplit model trained in this process on the same micro-batches.

The same initial weights (the same seed), the same data, micro-batch by micro-batch (so that
batch-norm sees the same samples), the mean loss, one optimizer step per batch: the losses a
correct pipeline must reproduce (DESIGN.md section 5: to 1e-5 relative in fp32).
"""

from __future__ import annotations

from torch import nn

from planner import ir
from planner.export.data import DataSpec, sub_batch
from planner.export.layers import disable_dropout
from planner.export.losses import make_loss
from planner.export.optim import DEFAULT_LR, torch_optimizer


def reference_losses(layers: tuple[nn.Module, ...], plan: ir.Plan, spec: DataSpec, steps: int, seed: int,
                     width: int, lr: float | None = None) -> list[float]:
    """Train the unsplit model in this process: the same micro-batches, mean loss, one step per batch."""
    disable_dropout(nn.Sequential(*layers))
    model = nn.Sequential(*layers).train()
    loss_fn = make_loss(spec.loss)
    params = list({id(p): p for p in model.parameters()}.values())
    opt = torch_optimizer(plan.optimizer, params, DEFAULT_LR[plan.optimizer] if lr is None else lr)
    m, pieces = plan.microbatches, plan.microbatches * width
    out = []
    for step in range(steps):
        x, y = spec.batch(step, plan.batch_size, seed)
        opt.zero_grad()
        total = 0.0
        for mb in range(m):
            for w in range(width):
                loss = loss_fn(model(sub_batch(x, mb, w, m, width)), sub_batch(y, mb, w, m, width))
                (loss / pieces).backward()
                total += float(loss.detach())
        opt.step()
        out.append(total / pieces)
    return out


CHECK_RTOL = 1e-5
"""How far an fp32 plan's losses may depart from the reference's, relative (DESIGN.md section 5)."""


def check_warning(plan: ir.Plan, diff: float) -> str | None:
    """What ``planner run --check`` warns of: an fp32 plan whose losses depart from single-process training by
    more than :data:`CHECK_RTOL` (16-bit plans round differently from the fp32 reference, and are not judged)."""
    if plan.precision != "fp32" or diff <= CHECK_RTOL:
        return None
    return (f"the losses depart from single-process training by {diff:.3g} relative, more than {CHECK_RTOL:g}: "
            "the plan does not train the model it was made from (report it, with the plan and the model)")


def max_rel_diff(a: list[float], b: list[float]) -> float:
    """The largest relative difference of two loss curves (``b`` the reference)."""
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))
