"""What the dispatcher keeps per run attempt, in the ``dispatch`` KV bucket under ``run.<run>.a<attempt>``: the
request it fans out (so a later Incremental round can send it on), the clusters nominated, when the round began,
and the chosen cluster, written once."""

from __future__ import annotations

import msgspec

from taugrid.bus.sites import dispatch_key
from taugrid.core.contracts import BackendApply

BUCKET = "dispatch"


class DispatchRecord(msgspec.Struct, frozen=True):
    apply: BackendApply
    cluster_queue: str
    mode: str
    nominated: list[str]
    round_started: float
    chosen: str = ""
    deleted: bool = False  # the renderer took the run back: every copy withdrawn, nothing more nominated
    announced: bool = False  # dispatch.chosen and the withdrawals are published (a later change of the winner's
    # Workload says nothing again, even after the streams' dedup window)
    finished: bool = False  # the chosen cluster reported the run's Workload finished: a loss no longer requeues it
    # clusters left out as lost, or as having no feed on BACKEND yet: not nominated until they rejoin (fenced,
    # renewing their lease again) or get one
    lost: list[str] = msgspec.field(default_factory=list)
    requeues: int = 0  # times the choice was reopened (a loss, an eviction at the chosen cluster, a lost cluster
    # back for a run still waiting): the ids of the requests and events sent since carry it
    # one cluster at a time may preempt for the run (core/dispatch.preemption_grant): the nominated clusters that
    # reported they could admit it only by preempting, in that order, those let preempt so far, and since when
    gated: list[str] = msgspec.field(default_factory=list)
    granted: list[str] = msgspec.field(default_factory=list)
    granted_at: float = 0.0
    chosen_version: int = 0  # the resourceVersion of the chosen cluster's admission that won: an eviction it
    # reports with a lower one is older than that admission (a redelivery) and reopens nothing


def key(run_id: str, attempt: int) -> str:
    return dispatch_key(run_id, attempt)  # a returning site reads the chosen cluster under the same key
