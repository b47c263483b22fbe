"""The line of each key a run's tau.yaml spelled out, for the policy's refusals only (issue 27).

``submit.accepted`` carried them (``config_lines``, ~290 B of a trivial run's RUNS, more for a real config) although
only a refusal reads them: resolution itself depends on what the config says, never on where. So the policy
resolves without them, and only when it refuses does it read them back from the config's text: the run's first
stored ``submit.requested``, the request the submitter answered (its sequence is the submitter's claim of the run
in the ``submissions`` bucket, ``id.<run>``, which only the submitter writes), parsed as the submitter parsed it
(``config.accepted.record``) and used only when that parse hashes as the accepted one (``acc.config_hash``, which
the policy fills in from the parse it resolves).

Trust: the lines only say where a refusal's key is in the user's own file (its field and line); what the policy
decides comes from ``submit.accepted`` alone. A request that is gone (aged out of AUDIT, or not copied there
within ``REQUEST_WAIT_S``), another request on the run's subject, or a text that does not hash to the accepted config
gives no lines, and the refusal names its fields without them, as it did for an accepted record of a release before
``config_lines``.

The request is read among the run's events (``bus/history.py``: HISTORY's and AUDIT's, one subject a run in each,
each event at its RUNS sequence), where AUDIT keeps it (``topology.AUDIT_KEPT_EVENTS``; HISTORY does not copy it a
second time): RUNS lets an event go once its consumers acked it, and the submitter acked the request before it
published ``submit.accepted``. AUDIT's feed copies it about a millisecond after RUNS stored it (the high lane's
through a feed of its own), so it is looked for again for a moment.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from taugrid.bus import history, kv
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.config import accepted
from taugrid.config.taujob import load_tau_config_shared
from taugrid.core.contracts import SubmitAccepted, SubmitRequested
from taugrid.core.errors import ConfigError
from taugrid.core.ids import run_claim, token

# how long a refusal waits for AUDIT to hold the request the submitter answered before naming its keys without
# lines (it is there long before in the usual case: RUNS stored it before the submitter read it)
REQUEST_WAIT_S = 2.0


async def of_request(bus: Bus, ev: Event, acc: SubmitAccepted) -> list[accepted.KeyLine]:
    """The key lines of the config ``acc`` accepted for run ``ev.subject`` (``ev``: its ``submit.accepted``), or
    ``[]`` when they cannot be read back as the submitter parsed them."""
    seq = await _first_request(bus, ev)
    if not seq:
        return []
    request = await _stored_at(bus, ev, seq)
    if request is None or (request.type, request.workspace, request.subject) != (
            "submit.requested", ev.workspace, ev.subject):
        return []
    try:
        req = request.payload(SubmitRequested)
        parse = accepted.record(load_tau_config_shared(req.config_text, path=acc.config_path))
    except (ConfigError, msgspec.MsgspecError):  # a body or a text that no longer decodes or parses: no lines
        return []
    return parse.lines if parse.config_hash == acc.config_hash else []


async def _stored_at(bus: Bus, ev: Event, seq: int) -> Event | None:
    """Run ``ev.subject``'s event RUNS stored at ``seq``, read from the run's events (HISTORY's and AUDIT's); None
    when they do not hold it within ``REQUEST_WAIT_S`` (aged out, another run's sequence)."""
    deadline = time.monotonic() + REQUEST_WAIT_S
    while True:
        found = next((got for got in await history.run_events(bus, token(ev.workspace), token(ev.subject))
                      if got.seq == seq), None)
        if found is not None or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(0.05)


async def _first_request(bus: Bus, ev: Event) -> int:
    """The RUNS sequence of the run's first stored request, as the submitter claimed it: ``id.<run>`` →
    ``<ws>:<seq>`` (its workspace must be the run's), or, claimed by an earlier release, ``run.<ws>.<run>`` →
    ``<seq>``; 0 when neither says."""
    claim = await kv.get(bus, "submissions", f"id.{ev.subject}")
    text = claim.value.decode(errors="replace") if claim is not None else ""
    ws, seq = run_claim(text)
    if seq is not None:
        return int(seq) if ws == ev.workspace and seq.isdigit() else 0
    earlier = await kv.get(bus, "submissions", f"run.{ev.workspace}.{ev.subject}")
    return int(earlier.value) if earlier is not None and earlier.value.isdigit() else 0

