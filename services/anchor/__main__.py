"""``python -m taugrid_services.anchor``: one replica (the file is appended by one writer).

Environment: ``TAU_ANCHOR_FILE`` (the JSON Lines file, on a volume the operator keeps and backs up),
``TAU_ANCHOR_KEY`` (a file holding the anchor nkey seed: the signing key, not a bus identity; the operator
keeps its public key to check anchors with ``tau verify --anchor``), ``TAU_ANCHOR_INTERVAL_S`` (default 60).
Every anchor is also logged as one line, so the cluster's log collection keeps a second copy out of reach of
whoever can rewrite the volume.
"""

from __future__ import annotations

import json
import logging

from taugrid.bus import creds
from taugrid.core.errors import PermanentError
from taugrid.evidence.anchor import Exporter
from taugrid.service import Service, main
from taugrid.settings import AnchorSettings

log = logging.getLogger("taugrid.anchor")


def exporter(given: AnchorSettings) -> Exporter:
    if given.file is None or given.key is None:
        missing = "TAU_ANCHOR_FILE" if given.file is None else "TAU_ANCHOR_KEY"
        raise PermanentError(f"{missing} is not set: the anchor service needs the file to append to "
                             "(TAU_ANCHOR_FILE) and the signing seed (TAU_ANCHOR_KEY)")
    return Exporter(given.file, bytearray(creds.read_seed(given.key).encode()))


async def start(svc: Service) -> None:
    given = svc.settings.anchor
    anchoring = exporter(given)

    async def anchor() -> None:
        signed, drift = await anchoring.export(svc.bus)
        for d in drift:
            log.error("ALARM: AUDIT %s", d)
        if signed is not None:
            log.info("anchor %s", json.dumps(signed, sort_keys=True, separators=(",", ":")))

    svc.every(given.interval_s, anchor)


if __name__ == "__main__":
    main("anchor", start)
