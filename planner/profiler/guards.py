"""What cannot be profiled for training, refused with a clear error instead of a crash or a bad file.

- :func:`check_trainable`: a model with no parameter that requires grad has nothing to train.
- :func:`check_output`: the model's output must be a floating-point tensor that requires grad (a
  loss's gradient flows back through it); an integer output (``argmax``) or a detached one has none.
- :func:`is_out_of_memory` / :func:`out_of_memory`: torch's allocation failures (CPU ``can't
  allocate memory``, CUDA ``out of memory``) as a ProfileError with the sizes and the fix.
- :func:`check_loadable`: the profile made must be one the tool's own reader accepts (the
  profile schema's bounds, ``planner/schemas/build.py``), else no file is written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from planner.errors import PlannerError, ProfileError
from planner.ir import ModelProfile

MEMORY_HINT = "use a smaller --batch-size or --input-shape, or --mode analytic (no memory needed)"


def check_trainable(params: Sequence[torch.Tensor], name: str) -> None:
    """A ProfileError when none of ``params`` requires grad: training would update nothing."""
    if any(p.requires_grad for p in params):
        return
    if not params:
        raise ProfileError(f"{name} has no parameters, so training it has nothing to update",
                           "profile a model with weights (nn.Linear, nn.Conv2d, ...)")
    raise ProfileError(f"none of {name}'s {len(params)} parameter tensors requires grad (all frozen), "
                       "so training it has nothing to update",
                       "unfreeze the weights you will train (requires_grad_(True)) in the model you return")


def check_output(dtype: torch.dtype, requires_grad: bool, what: str, shape: tuple[int, ...] | None = None) -> None:
    """A ProfileError unless a model's output (``what``, e.g. ``"m's output (its last layer 'fc')"``),
    of ``dtype`` and ``shape`` (batch first), can carry a gradient back from a loss per sample."""
    if not dtype.is_floating_point:
        raise ProfileError(f"{what} is a tensor of {str(dtype).replace('torch.', '')}, not floating point, so no "
                           "gradient flows back from a loss", "return the floating-point output (e.g. the logits), "
                           "not argmax or indices")
    if shape == ():
        raise ProfileError(f"{what} is a scalar, with no batch dimension, so a pipeline cannot split it into "
                           "micro-batches", "return the per-sample output (e.g. logits of shape (batch, classes)), "
                           "not a sum or a loss")
    if not requires_grad:
        raise ProfileError(f"{what} does not require grad: it depends on no trainable weight (detached, or "
                           "computed without weights)", "return an output computed from the weights you train, "
                           "without .detach()")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch (or Python) failing to allocate memory."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


_ASKED = re.compile(r"tried to allocate ([0-9]+ bytes|[0-9.]+ ?[KMGTP]i?B)", re.IGNORECASE)


def out_of_memory(what: str, device: torch.device | str, exc: BaseException, hint: str = MEMORY_HINT
                  ) -> ProfileError:
    """The error for running out of memory while doing ``what`` on ``device`` (torch's request size, if given)."""
    asked = _ASKED.search(str(exc))
    detail = f" (torch asked for {_bytes_text(asked.group(1))})" if asked else ""
    return ProfileError(f"out of memory {what} on {device}{detail}", hint)


def _bytes_text(text: str) -> str:
    """``"4096000000000000 bytes"`` -> ``"4.1e+15 bytes"``; other sizes as torch wrote them."""
    number, _, unit = text.partition(" ")
    return f"{int(number):.3g} bytes" if unit == "bytes" and number.isdigit() else text


def nbytes_text(n: int) -> str:
    """A byte count for a message: ``2.4e+11 bytes``."""
    return f"{n:.3g} bytes" if n >= 1000 else f"{n} bytes"


def check_loadable(prof: ModelProfile) -> None:
    """A ProfileError when ``prof`` holds a value the profile reader refuses (a bound of the schema)."""
    from planner import jsonio

    doc = prof.to_dict()
    try:
        jsonio.check_loadable(doc, where=f"the profile of {prof.model}")  # finite, within the schema's bounds
        ModelProfile.from_dict(json.loads(json.dumps(doc)), f"the profile of {prof.model}")
    except PlannerError as exc:
        raise ProfileError(f"{exc.cause}: out of what a profile file holds, so none is written",
                           "times shrink with a faster --device-flops or --efficiency, sizes with a smaller "
                           "--batch-size or --input-shape (the bounds: planner/schemas/README.md)") from None


def with_overrides(exc: PlannerError, overrides: Mapping[str, Any]) -> PlannerError:
    """``exc`` naming the ``--set`` overrides the model was built with (none: ``exc`` itself)."""
    if not overrides:
        return exc
    hint = f"{exc.hint}; or fix the --set values" if exc.hint else "fix the --set values"
    return type(exc)(f"{exc.cause} (with --set {shown_overrides(overrides)})", hint)


def shown_overrides(overrides: Mapping[str, Any]) -> str:
    """``{"n_layer": 2, "n_head": 5}`` -> ``n_layer=2 n_head=5``."""
    return " ".join(f"{k}={_value_text(v)}" for k, v in overrides.items())


def _value_text(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
