"""calibrate_sharing: what processes keep of their share of the cores while others compute beside them."""

from __future__ import annotations

import pytest

from planner import ir
from planner.calibrate import calibrate
from planner.calibrate_sharing import SharingModel, measure_sharing, model_kernel, sharing_efficiency, sharing_model
from tests.conftest import make_profile_dict


def test_sharing_efficiency_is_the_measured_work_ratio_at_most_1() -> None:
    assert sharing_efficiency(0.88) == pytest.approx(0.88)  # more CPU seconds per call beside the others
    assert sharing_efficiency(1.02) == 1.0  # noise above 1: no gain
    assert sharing_efficiency(0.0) is None and sharing_efficiency(float("nan")) is None


def test_work_ratio_is_cpu_per_call_alone_over_together_with_the_same_calls_on_every_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from planner import calibrate_sharing as cs

    cpu_s = [0.0]
    barriers: list[int] = []
    monkeypatch.setattr(dist, "barrier", lambda: barriers.append(1))
    monkeypatch.setattr(cs.time, "process_time", lambda: cpu_s[0])
    calls: list[bool] = []
    handoffs: list[int] = []

    def kernel() -> None:  # rank 0 of 2: alone after barrier 1 of a round's 3, together after barrier 3
        together = len(barriers) % 3 == 0
        calls.append(together)
        cpu_s[0] += 0.0125 if together else 0.010  # 10 ms of CPU alone, 12.5 ms beside the other

    def handoff() -> None:  # a stage's hand-off: its CPU seconds are the engine's, not the call's
        handoffs.append(len(calls))
        cpu_s[0] += 0.5

    monkeypatch.setattr(cs, "_agreed_calls", lambda k, w: 7)
    assert cs.work_ratio(kernel, rank=0, world=2, rounds=3, handoff=handoff) == pytest.approx(0.8)
    assert len(calls) == 3 * 2 * (7 + 1)  # 3 rounds, alone and together, 7 timed calls and one untimed each
    together_calls = [i + 1 for i, t in enumerate(calls) if t]
    assert handoffs == together_calls  # after every call together, and only then


def test_model_kernel_trains_the_whole_model_once_per_call() -> None:
    kernel = model_kernel(SharingModel("mlp", 4))
    kernel()  # a forward and backward: no error, any model planner profile builds


def test_the_profiles_own_model_only_when_measured_on_a_cpu_and_it_builds_as_profiled() -> None:
    from planner.profiler.zoo import mlp

    params = sum(p.numel() for p in mlp().parameters())
    doc = make_profile_dict(model="mlp", batch_size=8, mode="measured", device="cpu")
    doc["layers"] = [{**doc["layers"][0], "param_count": params}] + [{**x, "param_count": 0} for x in doc["layers"][1:]]
    profile = ir.ModelProfile.from_dict(doc)
    assert sharing_model(profile) == SharingModel("mlp", 8, profile.input_shape or None)
    analytic = {**doc, "mode": "analytic"}  # timed for a GPU: building it here may not even fit
    assert sharing_model(ir.ModelProfile.from_dict(analytic)) is None
    other = {**doc, "layers": [{**x, "param_count": 1} for x in doc["layers"]]}  # made with --set, say
    assert sharing_model(ir.ModelProfile.from_dict(other)) is None
    assert sharing_model(ir.ModelProfile.from_dict({**doc, "model": "toy"})) is None and sharing_model(None) is None


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, SharingModel("mlp", 8)])
def test_two_processes_keep_a_plausible_share_of_their_work_rate_alone(model: SharingModel | None) -> None:
    ratio = measure_sharing(2, 1, model)  # handing a token round the ring between calls, over gloo
    assert 0.5 < ratio < 1.3  # with one core each and nothing else running, near 1


@pytest.mark.slow
def test_calibrate_measures_the_sharing_with_the_profiles_model_when_it_builds() -> None:
    from planner.api import profile_model

    mlp = profile_model("mlp", batch_size=8, repeats=1)
    _, meta = calibrate(2, 1, profile=mlp)
    assert meta["sharing_kernel"] == "mlp"
    toy = ir.ModelProfile.from_dict(make_profile_dict())  # "toy" is no model planner can build
    _, meta = calibrate(2, 1, profile=toy)
    assert meta["sharing_kernel"] == "matmul+conv"
