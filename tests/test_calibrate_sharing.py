"""calibrate_sharing: what processes keep of their share of the cores while others compute beside them."""

from __future__ import annotations

import pytest

from planner import ir
from planner.calibrate import calibrate
from planner.calibrate_sharing import (
    Sharing,
    SharingModel,
    measure_sharing,
    model_kernel,
    pass_bytes,
    sharing_efficiency,
    sharing_model,
)
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
    monkeypatch.setattr(cs.time, "sleep", lambda s: None)
    calls: list[bool] = []
    handoffs: list[tuple[int, bool]] = []

    def kernel() -> None:  # rank 0 of 2: alone after barrier 1 of a round's 4, together after barrier 3
        together = len(barriers) % 4 == 3
        calls.append(together)
        cpu_s[0] += 0.0125 if together else 0.010  # 10 ms of CPU alone, 12.5 ms beside the other

    def handoff() -> None:  # a stage's hand-off: 0.5 ms of CPU while the other computes, 0.2 ms on idle cores
        busy = len(barriers) % 4 == 3
        handoffs.append((len(calls), busy))
        cpu_s[0] += 5e-4 if busy else 2e-4

    monkeypatch.setattr(cs, "_agreed_calls", lambda k, w: 7)
    got = cs.rank_sharing(kernel, rank=0, world=2, rounds=3, handoff=handoff)
    assert got.work_ratio == pytest.approx(0.8)  # the hand-offs' CPU seconds are not the calls'
    assert got.handoff_s == pytest.approx(3e-4)  # busy less idle
    assert len(calls) == 3 * 2 * (7 + 1)  # 3 rounds, alone and together, 7 timed calls and one untimed each
    together_calls = [i + 1 for i, t in enumerate(calls) if t]
    assert [n for n, busy in handoffs if busy] == together_calls  # after every call together
    assert sum(not busy for _, busy in handoffs) == 3 * 8  # and 8 on idle cores a round


def test_a_node_carries_the_measurement_a_handoff_cost_below_0_being_noise() -> None:
    node = ir.Node("cpu", (), 2.0)
    got = Sharing(0.9, 4e-4).on(node)
    assert (got.sharing_efficiency, got.handoff_s) == (pytest.approx(0.9), pytest.approx(4e-4))
    assert got.concurrent_devices == 2.0 and got.name == "cpu"
    assert Sharing(1.02, -1e-4).on(node).handoff_s == 0.0 and Sharing(1.02, -1e-4).on(node).sharing_efficiency == 1.0
    unusable = Sharing(float("nan"), float("nan")).on(node)
    assert unusable.handoff_s is None and unusable.sharing_efficiency is None


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


def test_a_profile_made_with_set_builds_its_own_model_and_one_too_big_for_the_memory_none() -> None:
    """llama-tiny profiled with --set: the sharing kernel builds it with the same overrides (it once built the base
    model, which for a 7B zoo model took 24 GB and was killed); a model whose pass would take more than half of
    each process's memory is not built at all."""
    from planner.profiler.hfzoo import build

    fields = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1}
    params = sum(p.numel() for p in build("llama-tiny", 16, fields).parameters())
    doc = make_profile_dict(model="llama-tiny", batch_size=2, mode="measured", device="cpu")
    doc["layers"] = [{**doc["layers"][0], "param_count": params}] + [{**x, "param_count": 0} for x in doc["layers"][1:]]
    doc["input_shape"], doc["meta"] = [16], {"overrides": fields}
    profile = ir.ModelProfile.from_dict(doc)
    got = sharing_model(profile)
    assert got == SharingModel("llama-tiny", 2, (16,), tuple(sorted(fields.items())))
    model_kernel(got)()  # the model the profile measured, a forward and backward
    assert sharing_model(profile, memory_bytes=pass_bytes(profile) * 1.9) is None
    assert sharing_model(profile, memory_bytes=pass_bytes(profile) * 2.1) == got


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, SharingModel("mlp", 8)])
def test_two_processes_keep_a_plausible_share_of_their_work_rate_alone(model: SharingModel | None) -> None:
    got = measure_sharing(2, 1, model)  # handing a token round the ring between calls, over gloo
    assert 0.5 < got.work_ratio < 1.3  # with one core each and nothing else running, near 1
    assert abs(got.handoff_s) < 0.05  # a hand-off costs well under a millisecond or two here


@pytest.mark.slow
def test_calibrate_measures_the_sharing_with_the_profiles_model_when_it_builds() -> None:
    from planner.api import profile_model

    mlp = profile_model("mlp", batch_size=8, repeats=1)
    _, meta = calibrate(2, 1, profile=mlp)
    assert meta["sharing_kernel"] == "mlp"
    toy = ir.ModelProfile.from_dict(make_profile_dict())  # "toy" is no model planner can build
    _, meta = calibrate(2, 1, profile=toy)
    assert meta["sharing_kernel"] == "matmul+conv"
