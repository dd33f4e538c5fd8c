"""How a layer's time scales with its micro-batch: the one home of the batch law.

Pure (numpy). A profile holds each layer's forward and backward seconds at its whole batch
``B``; a plan runs the layers on micro-batches of ``b = B / (M dp)`` samples. Each time is
split at ``b`` into a fixed part, paid whole by every call (kernel launches, reading the
weights), and a variable part, which a tensor group of ``n`` devices divides by ``n``
(``planner.costmodel.layers``):

- with ``batch_times`` (measured profiles: the layer timed at ``B/2, B/4, B/8, B/16`` too),
  the time at ``b`` lies on the straight line through the two measured batches around it
  (below the smallest, the line through the two smallest, anchored at the smallest), and the
  fixed part is that line's intercept, clamped into ``[0, t(b)]``. At a measured batch the
  time is the measured median itself. One line through all batches does not hold on real
  hardware: on this project's 2-core CPU, one thread, the residual CNN of
  ``scripts/validate_fidelity.py`` took 6.04 ms per sample at 32 samples and 5.14 at 16 (the
  activations leave the caches at 32), and the small GPT-2 6.63 ms at 16 and 8.22 at 2 (fixed
  costs); a line through the whole batch and a quarter of it was off by 6-18% at a half and at
  an eighth, the micro-batches of half of the fidelity table's plans. PipeDream (Narayanan et
  al., SOSP'19, section 3.1) and Alpa (Zheng et al., OSDI'22, section 5.2) profile at the
  micro-batch size for the same reason;
- without them, the two-point law ``t(b) = fixed + (b/B)(t(B) - fixed)`` with the layer's
  ``forward_fixed_s`` / ``backward_fixed_s`` (0 when unknown: time proportional to the batch,
  as analytic profiles without a roofline assume).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner import ir


@dataclass(frozen=True)
class AtBatch:
    """Per layer, seconds at one micro-batch on the profile's device: fixed and variable parts."""

    fwd_fixed: np.ndarray
    fwd_var: np.ndarray
    bwd_fixed: np.ndarray
    bwd_var: np.ndarray


def times_at(profile: ir.ModelProfile, micro_batch: float) -> AtBatch:
    """Every layer's forward and backward seconds at ``micro_batch`` samples (module doc)."""
    layers = profile.layers
    if not layers or not layers[0].batch_times:
        return _two_point(profile, micro_batch / profile.batch_size)
    batches, fwd, bwd = _curves(profile)
    fwd_fixed, fwd_var = local_line(batches, fwd, micro_batch)
    bwd_fixed, bwd_var = local_line(batches, bwd, micro_batch)
    return AtBatch(fwd_fixed, fwd_var, bwd_fixed, bwd_var)


_CURVES: dict[int, tuple[ir.ModelProfile, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
_CURVES_KEPT = 8


def _curves(profile: ir.ModelProfile) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The measured batches (ascending, the whole batch last) and per layer the forward and backward
    times there; kept for the last few profiles (a search asks once per grid and micro-batch count;
    the profile is held with them, so its id stays its own)."""
    kept = _CURVES.get(id(profile))
    if kept is not None and kept[0] is profile:
        return kept[1]
    layers = profile.layers
    batches = np.array([p.batch for p in reversed(layers[0].batch_times)] + [profile.batch_size], dtype=float)
    fwd = np.array([[p.forward_s for p in reversed(x.batch_times)] + [x.forward_s] for x in layers])
    bwd = np.array([[p.backward_s for p in reversed(x.batch_times)] + [x.backward_s] for x in layers])
    if len(_CURVES) >= _CURVES_KEPT:
        del _CURVES[next(iter(_CURVES))]
    _CURVES[id(profile)] = (profile, (batches, fwd, bwd))
    return batches, fwd, bwd


def _two_point(profile: ir.ModelProfile, share: float) -> AtBatch:
    layers = profile.layers
    fwd_fixed = np.array([x.forward_fixed_s or 0.0 for x in layers])
    bwd_fixed = np.array([x.backward_fixed_s or 0.0 for x in layers])
    fwd_var = (np.array([x.forward_s for x in layers]) - fwd_fixed) * share
    bwd_var = (np.array([x.backward_s for x in layers]) - bwd_fixed) * share
    return AtBatch(fwd_fixed, fwd_var, bwd_fixed, bwd_var)


def local_line(batches: np.ndarray, times: np.ndarray, b: float) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, variable) seconds per row of ``times`` (columns at ``batches``, ascending) at ``b``
    samples: the line through the two batches around ``b`` (module doc)."""
    i = int(np.clip(np.searchsorted(batches, b) - 1, 0, len(batches) - 2))
    slope = (times[:, i + 1] - times[:, i]) / (batches[i + 1] - batches[i])
    intercept = times[:, i] - slope * batches[i]
    if b >= batches[0]:
        total = np.maximum(intercept + slope * b, 0.0)
        fixed = np.clip(intercept, 0.0, total)
    else:  # below the smallest batch measured: anchored there, the line's intercept as fixed part
        fixed = np.clip(intercept, 0.0, times[:, 0])
        total = fixed + (times[:, 0] - fixed) * (b / batches[0])
    return fixed, total - fixed
