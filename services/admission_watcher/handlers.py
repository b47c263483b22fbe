"""Watch events → run events. Idempotent: translation is a pure function of the object, each output has a
deterministic message id, and events for stale attempts or finished runs are dropped."""

from __future__ import annotations

from collections import OrderedDict

from taugrid.bus import runstate
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core.contracts import WatchEvent
from taugrid.core.states import TERMINAL
from taugrid.kube.translate import RunRef, remember_owner, translate

_OWNER_MEMORY = 50_000


class AdmissionWatcher:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        # job uid → run; refilled from Job/RayJob events after a restart (kube-bridge relists on start).
        self.owners: OrderedDict[str, RunRef] = OrderedDict()

    async def on_event(self, ev: Event) -> None:
        watch = ev.payload(WatchEvent)
        remember_owner(watch, self.owners)
        while len(self.owners) > _OWNER_MEMORY:
            self.owners.popitem(last=False)
        for out in translate(watch, self.owners):
            record, _ = await runstate.get(self.bus, out.run_id)
            if record is not None and (record.state in TERMINAL or out.attempt < record.attempt):
                continue  # a finished run or a superseded attempt: history is already decided
            await self.bus.emit(workspace=out.workspace, run_id=out.run_id, attempt=out.attempt,
                                event_type=out.event_type, payload=out.payload, dedup=out.dedup)
