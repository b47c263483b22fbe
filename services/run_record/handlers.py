"""The run-record stage: every RUNS event folded into its run's record (``runrecord.Projector``).

The projector keeps each run's order itself and writes the events of a run that arrive during its previous
write together, so the consumer hands events over unordered (``ordered=False``). Idempotent: an event the record
has seen changes nothing; one older than what the record folded rebuilds it from the stream.
"""

from __future__ import annotations

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.runrecord import Projector


class Recorder:
    # How its consumer hands events over (``Service.consume``; the in-process test pipelines bind it alike):
    # unordered, the projector ordering each run's events itself, and a batch large enough that a burst's
    # lingering events (``projection.LINGER``) do not fill the consumer's window. Ordered, a run's next event would
    # wait for the lingering one's write, so the linger would hold every event behind it.
    BATCH = 256
    ORDERED = False

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.projector = Projector(bus)

    async def on_event(self, ev: Event) -> None:
        await self.projector.project(ev)
