"""The line of each key a run's tau.yaml spelled out, for the policy's refusals only (issue 27).

``submit.accepted`` carried them (``config_lines``, ~290 B of a trivial run's RUNS, more for a real config) although
only a refusal reads them: resolution itself depends on what the config says, never on where. So the policy
resolves without them, and only when it refuses does it read them back from the config's text: the run's first
stored ``submit.requested``, the request the submitter answered (its sequence is the submitter's claim of the run
in the ``submissions`` bucket, ``id.<run>``, which only the submitter writes), parsed as the submitter parsed it
(``config.accepted.record``) and used only when that parse hashes as the accepted one (``acc.config_hash``, which
the policy fills in from the parse it resolves).

Trust: the lines only say where a refusal's key is in the user's own file (its field and line); what the policy
decides comes from ``submit.accepted`` alone. A request that is gone (aged out of RUNS), another request on the run's
subject, or a text that does not hash to the accepted config gives no lines, and the refusal names its fields
without them, as it did for an accepted record of a release before ``config_lines``.
"""

from __future__ import annotations

import msgspec

from taugrid.bus import kv, streams
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.config import accepted
from taugrid.config.taujob import load_tau_config_shared
from taugrid.core.contracts import SubmitAccepted, SubmitRequested
from taugrid.core.errors import ConfigError
from taugrid.core.ids import run_claim


async def of_request(bus: Bus, ev: Event, acc: SubmitAccepted) -> list[accepted.KeyLine]:
    """The key lines of the config ``acc`` accepted for run ``ev.subject`` (``ev``: its ``submit.accepted``), or
    ``[]`` when they cannot be read back as the submitter parsed them."""
    seq = await _first_request(bus, ev)
    if not seq:
        return []
    request = await streams.at(bus, "RUNS", seq)
    if request is None or (request.type, request.workspace, request.subject) != (
            "submit.requested", ev.workspace, ev.subject):
        return []
    try:
        req = request.payload(SubmitRequested)
        parse = accepted.record(load_tau_config_shared(req.config_text, path=acc.config_path))
    except (ConfigError, msgspec.MsgspecError):  # a body or a text that no longer decodes or parses: no lines
        return []
    return parse.lines if parse.config_hash == acc.config_hash else []


async def _first_request(bus: Bus, ev: Event) -> int:
    """The stream sequence of the run's first stored request, as the submitter claimed it: ``id.<run>`` →
    ``<ws>:<seq>`` (its workspace must be the run's), or, claimed by an earlier release, ``run.<ws>.<run>`` →
    ``<seq>``; 0 when neither says."""
    claim = await kv.get(bus, "submissions", f"id.{ev.subject}")
    text = claim.value.decode(errors="replace") if claim is not None else ""
    ws, seq = run_claim(text)
    if seq is not None:
        return int(seq) if ws == ev.workspace and seq.isdigit() else 0
    earlier = await kv.get(bus, "submissions", f"run.{ev.workspace}.{ev.subject}")
    return int(earlier.value) if earlier is not None and earlier.value.isdigit() else 0

