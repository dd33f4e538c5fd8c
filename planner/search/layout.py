"""A baseline's answer before it is judged (:class:`Layout`), or why it cannot run (:class:`NotFitting`).

Pure (no torch, click or rich): the values every baseline builder (:mod:`planner.search.baselines`,
:mod:`planner.search.megatron`) returns and ``planner compare`` judges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner import ir

__all__ = ["Layout", "NotFitting", "divisors"]


@dataclass(frozen=True)
class NotFitting:
    """A strategy that cannot run on this cluster, and why (one line)."""

    name: str
    reason: str


@dataclass(frozen=True)
class Layout:
    """A strategy's answer before it is judged: stages (layers, devices, forms) and a schedule.

    ``microbatches`` lists the micro-batch counts the strategy may use; the comparison
    simulates each and keeps the fastest that fits (a user would tune it too). ``tp``: the
    tensor degree of every stage (1: data parallel only; AccPar's split forms span the
    whole stage). ``zero``: the ZeRO stage of every stage with two or more data-parallel ranks (the
    others run 0: there is nothing to shard over). ``recompute``: every stage's recomputation before
    the judge gives an overflowing stage ``full``; ``sequence_parallel``: Megatron-LM's sequence
    parallelism on the blocks of every tensor-parallel stage; ``virtual_stages``: the model chunks per device
    group of an interleaved schedule (``stages`` then lists the chunks, chunk c on the devices of chunk c mod K);
    ``flags``: below.
    """

    name: str
    stages: tuple[tuple[tuple[int, int], tuple[str, ...], tuple[str, ...]], ...]
    schedule: str
    microbatches: tuple[int, ...]
    tp: int = 1
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    virtual_stages: int = 1
    flags: str = ""
    """The system's own options that give this layout beyond its setting's (Megatron-LM's uneven first and last
    pipeline stages), shown after the setting's name where the layout is the row's; empty where none."""

    def _zero_of(self, devices: Sequence[str]) -> int:
        """The stage's ZeRO stage: :attr:`zero` over two or more data-parallel ranks, else 0."""
        return self.zero if len(devices) // self.tp >= 2 else 0

    @property
    def data_parallel(self) -> bool:
        """Whether a stage has two or more data-parallel ranks (a ZeRO stage then shards something)."""
        return any(len(devices) // self.tp >= 2 for _, devices, _ in self.stages)

    @property
    def config(self) -> str:
        groups = self.stages[:len(self.stages) // self.virtual_stages]  # interleaved: the first chunk of each group
        return ir.config_string([len(devices) for _, devices, _ in groups])

    def plan(self, profile: ir.ModelProfile, cluster: ir.Cluster, microbatches: int, optimizer: str,
             recompute: Sequence[bool] | None = None) -> ir.Plan:
        """This layout as an unjudged plan, in the profile's own precision (as ``planner search`` trains
        by default, so that a baseline and the planner's row compute in the same number format):
        memory and prediction are filled in by the judge."""
        from planner.costmodel import default_precision

        recomputed = list(recompute) if recompute is not None else [False] * len(self.stages)
        stages = tuple(ir.Stage(layers, devices, forms, 0, "full" if flag else self.recompute, tp=self.tp,
                                zero=self._zero_of(devices),
                                sequence_parallel=self.sequence_parallel and self.tp > 1)
                       for (layers, devices, forms), flag in zip(self.stages, recomputed, strict=True))
        return ir.Plan(profile=profile, cluster=cluster, schedule=self.schedule, microbatches=microbatches,
                       optimizer=optimizer, stages=stages, predicted=ir.Prediction(0.0, 0.0, 0.0, 0),
                       engine="any", solver=self.name, precision=default_precision(profile),
                       virtual_stages=self.virtual_stages)


def divisors(n: int) -> tuple[int, ...]:
    """The positive divisors of ``n``, ascending (pairs up to its square root: a batch of ten million is no
    ten-million-step loop)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))
