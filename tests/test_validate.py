"""validate_plan: a plan's schedule, layer cover, forms, devices and micro-batches are consistent."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from planner import ir
from planner.errors import PlanError
from planner.simulate import validate_plan as reexported
from planner.validate import validate_plan
from tests.conftest import make_cluster_dict, make_profile_dict


def make_plan(schedule: str = "1f1b", microbatches: int = 4, n_layers: int = 4, virtual_stages: int = 1,
              stages: Sequence[tuple[tuple[int, int], tuple[str, ...]]] | None = None) -> ir.Plan:
    """A small self-contained plan on the conftest profile and 2 x 2 cluster."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(n_layers))
    cluster = ir.Cluster.from_dict(make_cluster_dict())
    if stages is None:
        stages = [((0, n_layers // 2), ("n0.g0",)), ((n_layers // 2, n_layers), ("n1.g0",))]
    return ir.Plan(
        profile=profile, cluster=cluster, schedule=schedule, microbatches=microbatches, optimizer="sgd",
        stages=tuple(ir.Stage(layers, devs, ("dp",) * (layers[1] - layers[0]), 0) for layers, devs in stages),
        predicted=ir.Prediction(1.0, 8.0, 0.0, 0), virtual_stages=virtual_stages,
    )


def test_validate_plan_accepts_good_plans() -> None:
    validate_plan(make_plan())
    validate_plan(make_plan("interleaved", 4, 4, 2, [((0, 1), ("n0.g0",)), ((1, 2), ("n1.g0",)),
                                                      ((2, 3), ("n0.g0",)), ((3, 4), ("n1.g0",))]))


@pytest.mark.parametrize(("plan", "message"), [
    (make_plan(stages=[((0, 1), ("n0.g0",)), ((2, 4), ("n1.g0",))]), "layer 1 in no stage"),
    (make_plan(stages=[((0, 3), ("n0.g0",)), ((2, 4), ("n1.g0",))]), "layer 2 is in two stages"),
    (make_plan(stages=[((0, 2), ("n0.g0",)), ((2, 3), ("n1.g0",))]), "layers 3..3 are in no stage"),
    (make_plan(stages=[((0, 2), ("n0.g0",)), ((2, 4), ("n9.g9",))]), "device 'n9.g9', which is not in cluster"),
    (make_plan(stages=[((0, 2), ("n0.g0",)), ((2, 4), ("n0.g0",))]), "is in stage 0 and stage 1"),
    (make_plan(stages=[((0, 2), ("n0.g0", "n0.g0")), ((2, 4), ("n1.g0",))]), "lists a device twice"),
    (make_plan(schedule="zigzag"), "unknown schedule 'zigzag'"),
    (make_plan(microbatches=3), "do not divide the batch size 8"),
    (make_plan(virtual_stages=2), "virtual_stages=2 under schedule '1f1b'"),
    (make_plan("interleaved", 4, 4, 2, [((0, 1), ("n0.g0",)), ((1, 2), ("n1.g0",)), ((2, 3), ("n1.g0",)),
                                        ((3, 4), ("n0.g0",))]), "chunk c runs on the devices"),
])
def test_validate_plan_names_what_is_wrong(plan: ir.Plan, message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(".", r"\.")):
        validate_plan(plan)


def test_a_misplaced_chunk_of_a_large_cluster_is_named_in_one_short_line() -> None:
    """An interleaved plan on 64 servers whose chunk runs on the wrong group: the message names the groups by their
    first and last devices and size (it listed all 512 names of each)."""
    cluster = ir.Cluster.from_dict(make_cluster_dict(nodes=64, gpus_per_node=8))
    names = [g.name for g in cluster.gpus]
    half = len(names) // 2
    plan = dataclasses.replace(make_plan("interleaved", 4, 4, 2), cluster=cluster, stages=tuple(
        ir.Stage((i, i + 1), tuple(names[:half] if i in (0, 3) else names[half:]), ("dp",), 0) for i in range(4)))
    with pytest.raises(PlanError, match=r"runs on \['n32\.g0', 'n32\.g1', \.\., 'n63\.g7'\] \(256 devices\)") as err:
        validate_plan(plan)
    assert len(err.value.cause) < 200


def test_validate_plan_forms_count() -> None:
    plan = make_plan()
    bad = dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], forms=("dp",)), plan.stages[1]))
    with pytest.raises(PlanError, match="1 forms for 2 layers"):
        validate_plan(bad)


def test_simulate_reexports_validate_plan() -> None:
    assert reexported is validate_plan


def test_split_forms_without_a_tensor_group_are_a_plan_error() -> None:
    plan = make_plan(stages=[((0, 2), ("n0.g0", "n0.g1")), ((2, 4), ("n1.g0", "n1.g1"))])
    split = dataclasses.replace(plan.stages[0], forms=("split_out", "split_in"))
    with pytest.raises(PlanError, match="stage 0: tp is 1 but the stage has split_in, split_out forms") as err:
        validate_plan(dataclasses.replace(plan, stages=(split, plan.stages[1])))
    assert "give tp" in err.value.hint
    validate_plan(dataclasses.replace(plan, stages=(dataclasses.replace(split, tp=2), plan.stages[1])))




def test_dp_layers_of_a_tensor_group_need_samples_it_divides() -> None:
    """A tp 2 stage at 1 sample per micro-batch and rank was the cost model's "form 'dp' is not open to layer 0",
    whose hint said layers run 'dp' only (reviewer's find): now the stage, its samples and the fix."""
    from planner.simulate import simulate

    plan = make_plan(microbatches=8, stages=[((0, 2), ("n0.g0", "n0.g1")), ((2, 4), ("n1.g0", "n1.g1"))])
    grids = tuple(dataclasses.replace(s, tp=2) for s in plan.stages)
    one = dataclasses.replace(plan, stages=grids)  # batch 8 / (8 micro-batches x dp 1): 1 sample over tp 2
    for check in (validate_plan, simulate):
        with pytest.raises(PlanError, match=r"stage 0: its 'dp' layers split each micro-batch's 1 samples per "
                                            r"data-parallel rank \(batch 8 / \(8 micro-batches x dp 1\)\) over its "
                                            r"tensor group of 2 GPUs") as err:
            check(one)
        assert "fewer micro-batches" in err.value.hint
    validate_plan(dataclasses.replace(one, microbatches=4))  # 2 samples: one per GPU of the group
    validate_plan(dataclasses.replace(plan, microbatches=8))  # tp 1: nothing to split
