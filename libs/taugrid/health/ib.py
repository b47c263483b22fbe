"""InfiniBand/RoCE ports from sysfs (no root needed): ``<root>/<hca>/ports/<port>/{state,phys_state,rate,
link_layer}`` and the counter files under ``counters/`` and ``hw_counters/`` (gpu-health.md §6.1).

Invariant: never raises. A missing tree (no HCA) is no ports; an unreadable or malformed file leaves that field
unknown (empty, None, or the counter absent), never a made-up healthy value.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from taugrid.core.contracts import IbPort

log = logging.getLogger("taugrid.health.ib")

SYSFS_ROOT = "/sys/class/infiniband"
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _named(value: str) -> str:
    """``"4: ACTIVE"`` → ``"ACTIVE"``; ``"5: LinkUp"`` → ``"LinkUp"``."""
    return value.split(":", 1)[1].strip() if ":" in value else value


def _counters(port_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for sub in ("counters", "hw_counters"):
        d = port_dir / sub
        if not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            text = _read(f)
            if text.isdigit():
                out[f.name] = int(text)
    return out


def read_ports(root: str | Path = SYSFS_ROOT) -> list[IbPort]:
    base = Path(root)
    try:
        hcas = sorted(p for p in base.iterdir() if (p / "ports").is_dir())
    except OSError:
        return []
    ports: list[IbPort] = []
    for hca in hcas:
        try:
            port_dirs = sorted((hca / "ports").iterdir(), key=lambda p: p.name)
        except OSError as exc:
            log.debug("%s: ports unreadable: %s", hca, exc)
            continue
        for pd in port_dirs:
            if not pd.name.isdigit():
                continue
            rate = _RATE.match(_read(pd / "rate"))
            ports.append(IbPort(hca=hca.name, port=int(pd.name), state=_named(_read(pd / "state")),
                                phys_state=_named(_read(pd / "phys_state")),
                                rate_gbps=float(rate.group(1)) if rate else None,
                                link_layer=_read(pd / "link_layer"), counters=_counters(pd)))
    return ports
