"""What a stage costs per micro-batch: the cost model's answer, the simulator's input (StageCost)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.ir.cluster import Link


@dataclass(frozen=True)
class StageCost:
    """What one stage costs per micro-batch, per device of its group (cost model -> simulator).

    Times are for one micro-batch on the stage's slowest device, collectives of the split
    forms included. ``backward_weight_s`` is the weight-gradient part of ``backward_s``
    (the ``W`` of zero-bubble schedules). ``send_bytes`` cross to the next stage per
    micro-batch over ``send_link`` (the same bytes come back as gradients in backward);
    transfers on one ``send_link_id`` share its bandwidth. ``allreduce_s`` is the
    gradient synchronisation of the stage's data-parallel weights after its last backward.
    Memory per device: ``static_bytes`` (weights, gradients, optimizer state),
    ``weight_bytes`` (one weight version, for stashing), ``activation_bytes`` kept per
    micro-batch in flight, ``workspace_bytes`` transient during one backward,
    ``capacity_bytes`` the smallest memory in the group. ``optimizer_step_s`` is the
    optimizer step of the stage's parameters, run once per iteration after its all-reduce
    (0 when the devices' memory bandwidth is unknown). ``grad_copy_bytes`` is held while the
    gradients are all-reduced after the last backward, when the activations are gone: the
    engine's flat copy of them (planner.costmodel.variant). ``zero_gather_s`` is the part of
    ``forward_s + backward_s`` that is ZeRO-3's collectives (its weights' all-gathers in forward and
    backward, and the reduce-scatter in backward where it runs per micro-batch): data-parallel
    communication that blocks the stage, reported with the all-reduce (planner.explain).
    """

    devices: tuple[str, ...]
    forward_s: float
    backward_s: float
    backward_weight_s: float
    send_bytes: float
    send_link: Link | None
    send_link_id: str | None
    allreduce_s: float
    allreduce_bytes: float
    static_bytes: int
    weight_bytes: int
    activation_bytes: int
    workspace_bytes: int
    capacity_bytes: int
    optimizer_step_s: float = 0.0
    grad_copy_bytes: int = 0
    zero_gather_s: float = 0.0

    @property
    def send_s(self) -> float:
        """Unshared time to send one micro-batch's activations to the next stage."""
        return 0.0 if self.send_link is None else self.send_link.transfer_s(self.send_bytes)
