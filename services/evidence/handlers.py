"""Evidence handler: every run event goes into the run's hash-chained ledger; the terminal event seals it.

Idempotent, because redelivery happens (also after a successful ack when the server dies):
- the ledger append is keyed by event id and written with compare-and-set (``taugrid.evidence.store``);
- the seal is claimed once per run in the same CAS write, so a duplicate terminal event or a second, racing
  terminal event (cancelled vs. gave_up) never seals again — first wins;
- a bundle already stored for the winning event is reused, not rebuilt;
- ``evidence.sealed`` carries the deterministic id ``<run>.<attempt>.evidence.sealed`` (the stream drops a
  republish) and, once it is on the bus, the ledger records that it was emitted.
``evidence.sealed`` itself arrives on ``run.>``: it is appended to the ledger like any event, never sealed.

Kept in memory, both rebuilt from the bus when missing: the ledgers last written (their revision is only the
CAS precondition) and the events of runs not yet sealed (the bundle's events, else fetched back from RUNS).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core.events import TERMINAL_EVENTS
from taugrid.evidence import store
from taugrid.local.cleanup import remove_finished_pods

log = logging.getLogger("taugrid.evidence")


_RUNS_HELD = 1024  # runs whose events are held for their seal


class Evidence:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.ledgers = store.LedgerCache()
        self.held: OrderedDict[str, dict[int, Event]] = OrderedDict()  # run → stream seq → event

    def _hold(self, run_id: str, ev: Event) -> dict[int, Event]:
        events = self.held.pop(run_id, None) or {}
        self.held[run_id] = events
        if ev.seq:
            events[ev.seq] = ev
        while len(self.held) > _RUNS_HELD:
            self.held.popitem(last=False)
        return events

    async def on_event(self, ev: Event) -> None:
        ledger = await store.record(self.bus, ev, cache=self.ledgers)
        workspace, run_id = store.run_of(ev)
        if ev.type == "evidence.sealed":  # a run's last event: nothing more to hold or to keep cached
            self.held.pop(run_id, None)
            # A sealed run's ledger (about 1 KB per entry) would otherwise stay among the cache's 4,096 most
            # recent: tens of MB over a long run. An event that still comes after the seal reads it from KV.
            self.ledgers.forget(store.key(workspace, run_id))
            return
        held = self._hold(run_id, ev)
        if ev.type not in TERMINAL_EVENTS:
            return
        claim = ledger.seal
        if claim is None or claim.event_id != ev.id or claim.emitted:
            return  # another terminal event won the seal, or this one is already announced
        sealed = await store.seal(self.bus, workspace, run_id, ev, cache=self.ledgers, known=held)
        await self.bus.emit(
            workspace=workspace,
            run_id=run_id,
            attempt=sealed.attempt,
            event_type="evidence.sealed",
            payload=sealed,
            dedup="",
        )
        final = await store.mark_emitted(self.bus, workspace, run_id, cache=self.ledgers)
        if any(e.type == "evidence.sealed" for e in final.entries):  # it was handled first, see above
            self.ledgers.forget(store.key(workspace, run_id))
        self.held.pop(run_id, None)
        data_dir = os.environ.get("TAU_DATA_DIR")
        if data_dir:  # the embedded stack: what the pods left on disk is sealed now (outputs stay)
            removed = remove_finished_pods(Path(data_dir) / "pods", run_id)
            if removed:
                log.info("removed pod directories of %s: %s", run_id, ", ".join(removed))
        log.info(
            "sealed %s (%s, attempt %s): %s", run_id, sealed.terminal_state, sealed.attempt, sealed.digest
        )
