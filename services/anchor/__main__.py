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
import os
from pathlib import Path

from taugrid.bus import creds
from taugrid.core.errors import PermanentError
from taugrid.evidence.anchor import Exporter
from taugrid.service import Service, main

log = logging.getLogger("taugrid.anchor")


def exporter_from_env() -> Exporter:
    try:
        path, key = Path(os.environ["TAU_ANCHOR_FILE"]), Path(os.environ["TAU_ANCHOR_KEY"])
    except KeyError as missing:
        raise PermanentError(f"{missing.args[0]} is not set: the anchor service needs the file to append to "
                             "(TAU_ANCHOR_FILE) and the signing seed (TAU_ANCHOR_KEY)") from None
    return Exporter(path, bytearray(creds.read_seed(key).encode()))


async def start(svc: Service) -> None:
    exporter = exporter_from_env()
    interval = float(os.environ.get("TAU_ANCHOR_INTERVAL_S", "60"))

    async def anchor() -> None:
        signed, drift = await exporter.export(svc.bus)
        for d in drift:
            log.error("ALARM: AUDIT %s", d)
        if signed is not None:
            log.info("anchor %s", json.dumps(signed, sort_keys=True, separators=(",", ":")))

    svc.every(interval, anchor)


if __name__ == "__main__":
    main("anchor", start)
