"""Evidence handler: a run's terminal event seals it (its ledger, its bundle, ``evidence.sealed``).

The durable receives only the terminal events (``topology.CONSUMERS["evidence"]``); the run's other events are
read back from HISTORY and AUDIT at the seal, in RUNS' order (``taugrid.evidence.store.run_history``). Per run: the
bundle, one create of the ledger (with the seal and the bundle's digest), ``evidence.sealed``. Idempotent, because
redelivery happens (also after a successful ack when the server dies), and restart safe, because the terminal
event is acked only once all of that is done:
- the run is sealed by its first terminal event in stream order: a duplicate, or a second, racing terminal event
  (cancelled vs. gave_up), finds the ledger sealed, or builds the same one (first wins);
- a bundle already stored for the winning event is reused, not rebuilt;
- ``evidence.sealed`` carries the deterministic id ``<run>.<attempt>.evidence.sealed`` (the stream drops a
  republish), and a seal resumed later looks for it in AUDIT before publishing (AUDIT is the record that it
  was made: the ledger's ``seal.emitted`` is no longer written).
"""

from __future__ import annotations

import logging

from taugrid import backend
from taugrid.bus import platformread
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core.events import TERMINAL_EVENTS
from taugrid.evidence import archive, store

log = logging.getLogger("taugrid.evidence")


class Evidence:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def on_event(self, ev: Event) -> None:
        if ev.type not in TERMINAL_EVENTS:
            return  # delivered under the durable's earlier filter (``run.>``, before an upgrade): nothing to do
        # The seal reads the platform three times (the archive a bundle not on the bus may be in, the run's price,
        # the archive to move it to): one mark serves them, the platform as the seal first read it (issue 30)
        with platformread.one_mark():
            await self._seal(ev)

    async def _seal(self, ev: Event) -> None:
        sealed = await store.seal(self.bus, ev)
        announced = await store.announce(self.bus, sealed)
        # after the announcement, and on every delivery: a redelivery finishes a move an outage interrupted
        # (a run archived already has no bundle left on the bus: nothing is read from the archive then)
        into = await archive.configured(self.bus)
        if into is not None and await archive.archive_run(self.bus, sealed.ledger, into):
            log.info("archived the evidence of %s to %s", sealed.ledger.run_id, into.where)
        if not announced:
            return  # a redelivery, or a later terminal event of a run already sealed and announced
        ledger = sealed.ledger
        _, run_id = store.run_of(ev)
        removed = backend.release_sealed(run_id)  # what the pods left on disk is sealed now (outputs stay)
        if removed:
            log.info("removed pod directories of %s: %s", run_id, ", ".join(removed))
        claim = ledger.seal
        assert claim is not None
        log.info("sealed %s (%s, attempt %s): %s", run_id, claim.type, claim.attempt, claim.digest)
