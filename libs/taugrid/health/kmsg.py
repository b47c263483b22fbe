"""XID records from the kernel log: a pure parser for ``NVRM: Xid`` lines, an optional ``/dev/kmsg`` reader.

NVML misses some XIDs (79/119/120 on some drivers, gpu-health.md §0), so the node agent reads the kernel log
too — but only when it may: ``/dev/kmsg`` needs root or CAP_SYSLOG. ``KmsgReader.open_if_readable`` returns
None instead of failing, and the agent then relies on NVML events alone.

Invariant: the parser never raises on odd input; a line it does not understand yields None.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import time
from typing import NamedTuple

log = logging.getLogger("taugrid.health.kmsg")

# e.g. "NVRM: Xid (PCI:0000:3b:00): 79, pid=1896, GPU has fallen off the bus."
_XID = re.compile(r"NVRM: Xid \(PCI:(?P<bdf>[0-9a-fA-F:.]+)\): (?P<xid>\d+),?(?P<rest>.*)$")
_PID = re.compile(r"pid=['\"]?(?P<pid>\d+)")
# /dev/kmsg record: "<prio>,<seq>,<usec since boot>,<flags>[,...];<message>"
_KMSG = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")


class XidRecord(NamedTuple):
    bdf: str  # PCI address as the driver printed it, e.g. "0000:3b:00"
    xid: int
    pid: int | None
    detail: str
    line: str


def pci_key(bdf: str) -> str:
    """Normalise a PCI address so kmsg's ``0000:3b:00`` and NVML's ``00000000:3B:00.0`` compare equal."""
    parts = bdf.lower().split(".")[0].split(":")
    if len(parts) < 2:
        return bdf.lower()
    bus, dev = parts[-2], parts[-1]
    domain = parts[-3] if len(parts) >= 3 else "0"
    try:
        return f"{int(domain, 16):x}:{int(bus, 16):02x}:{int(dev, 16):02x}"
    except ValueError:
        return bdf.lower()


def parse_xid_line(line: str) -> XidRecord | None:
    """One kernel-log line (dmesg, journald or /dev/kmsg format) → its XID record, or None."""
    m = _XID.search(line)
    if m is None:
        return None
    rest = m.group("rest").strip()
    pid_m = _PID.search(rest)
    detail = rest
    # Drop "pid=…, name=…," so detail is the driver's human text.
    detail = re.sub(r"^(pid=[^,]*,\s*)?(name=[^,]*,\s*)?", "", detail).strip()
    return XidRecord(
        bdf=m.group("bdf"), xid=int(m.group("xid")), pid=int(pid_m.group("pid")) if pid_m else None,
        detail=detail, line=line.rstrip("\n"),
    )


def parse_kernel_log(text: str) -> list[XidRecord]:
    """Every XID record in a block of kernel-log text, in order."""
    return [rec for line in text.splitlines() if (rec := parse_xid_line(line)) is not None]


class KmsgReader:
    """Non-blocking reader of ``/dev/kmsg`` that yields XID records appended since the last read.

    On open, the ring buffer's backlog is scanned but only records newer than ``lookback_s`` are kept
    (NVML does not replay events that happened before registration; NPD uses the same 5-minute lookback).
    """

    def __init__(self, fd: int, *, lookback_s: float = 300.0) -> None:
        self._fd = fd
        self._since_usec = max(0.0, (time.monotonic() - lookback_s) * 1e6)

    @classmethod
    def open_if_readable(cls, path: str = "/dev/kmsg", *, lookback_s: float = 300.0) -> KmsgReader | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            log.info("kernel log %s not readable (%s); XIDs come from NVML events only", path, exc.strerror)
            return None
        return cls(fd, lookback_s=lookback_s)

    def read_new(self, *, max_records: int = 10000) -> list[XidRecord]:
        out: list[XidRecord] = []
        for _ in range(max_records):
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten before we read them; carry on
                    continue
                log.warning("reading kernel log failed: %s", exc)
                break
            if not chunk:
                break
            line = chunk.decode("utf-8", "replace")
            m = _KMSG.match(line)
            if m is not None and float(m.group("usec")) < self._since_usec:
                continue
            rec = parse_xid_line(m.group("msg") if m else line)
            if rec is not None:
                out.append(rec)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
