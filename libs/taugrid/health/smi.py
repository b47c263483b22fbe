"""AMD and Intel Gaudi GPUs read through their vendors' command-line tools, into the same ``GpuSample`` NVML fills.

The same fields mean the same thing, so ``health.rules`` raises the same conditions (uncorrected ECC, thermal,
PCIe replays, a GPU gone missing) and the monitor runs the same chain (cordon, drain, retry elsewhere, repair,
validate, uncordon) whichever vendor's GPU failed:

* AMD: ``amd-smi metric --json`` (ROCm's amd-smi CLI, ``amdsmi_cli/amdsmi_commands.py`` in ROCm/amdsmi). Per GPU
  ``gpu`` (index), ``ecc.total_uncorrectable_count`` plus ``ecc.total_deferred_count`` (a deferred error is an
  uncorrectable one whose poisoned data has not been consumed yet: it needs the same reset) as uncorrected ECC
  since the driver loaded, ``temperature.hotspot`` (else ``edge``), ``pcie.replay_count``,
  ``mem_usage.total_vram``/``used_vram``, ``usage.gfx_activity``, ``power.socket_power``; values are
  ``{"value": v, "unit": u}`` or ``"N/A"``.
* Gaudi: ``hl-smi -Q <fields> -f csv,noheader,nounits`` (the fields nvidia-smi's ``--query-gpu`` would name, with
  ``aip`` for the accelerator): index, uuid, name, bus id, memory total and used (MiB), utilization, temperature,
  power, and ``ecc.errors.uncorrected.volatile.total`` / ``.aggregate.total``.

Invariants (``probe``'s): ``read_gpus`` never raises; a tool that is absent or fails gives ``source="none"`` and
``"no GPUs: <why>"``, said once in the log; "N/A" (or a field the tool does not have) is None, unknown, never 0.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from taugrid.core.contracts import GpuSample, NodeSample
from taugrid.health.probe import GpuReading, take_sample

log = logging.getLogger("taugrid.health.smi")

Runner = Callable[[list[str]], str]
AMD_SMI = ["amd-smi", "metric", "--json"]
HL_SMI_FIELDS = ("index", "uuid", "name", "bus_id", "memory.total", "memory.used", "utilization.aip",
                 "temperature.aip", "power.draw", "ecc.errors.uncorrected.volatile.total",
                 "ecc.errors.uncorrected.aggregate.total")
HL_SMI = ["hl-smi", "-Q", ",".join(HL_SMI_FIELDS), "-f", "csv,noheader,nounits"]
_TIMEOUT_S = 20.0


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=_TIMEOUT_S).stdout


def _number(value: Any) -> float | None:
    """``{"value": 41, "unit": "W"}``, ``41``, ``"41"`` → 41.0; ``"N/A"``, absent or text → None."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _mib(value: Any) -> int | None:
    """A memory size in MiB from amd-smi's ``{"value": v, "unit": "MB"|"GB"|"B"}``."""
    number = _number(value)
    if number is None:
        return None
    unit = str(value.get("unit", "MB")).upper() if isinstance(value, dict) else "MB"
    scale = {"B": 1 / (1 << 20), "KB": 1 / 1024, "MB": 1, "GB": 1024}.get(unit, 1)
    return int(number * scale)


def _block(row: dict[str, Any], key: str) -> dict[str, Any]:
    """One of a GPU's sections; a section the tool reports as "N/A" (or not at all) reads as empty."""
    value = row.get(key)
    return value if isinstance(value, dict) else {}


def parse_amd_smi_metric(text: str) -> list[GpuSample]:
    """GPUs from ``amd-smi metric --json``: a ``{"gpu_data": [...]}`` document (ROCm 7) or the bare list (6.x)."""
    doc = json.loads(text)
    rows = doc.get("gpu_data", []) if isinstance(doc, dict) else doc
    out: list[GpuSample] = []
    for row in rows:
        if not isinstance(row, dict) or _int(row.get("gpu")) is None:
            continue
        ecc = _block(row, "ecc")
        uncorrected = _int(ecc.get("total_uncorrectable_count"))
        deferred = _int(ecc.get("total_deferred_count"))
        if uncorrected is not None and deferred is not None:
            uncorrected += deferred
        temperature = _block(row, "temperature")
        hot = _int(temperature.get("hotspot"))
        memory, usage, power, pcie = (_block(row, k) for k in ("mem_usage", "usage", "power", "pcie"))
        out.append(GpuSample(
            index=int(_int(row["gpu"]) or 0), name="AMD GPU",
            memory_total_mb=_mib(memory.get("total_vram")) or 0, memory_used_mb=_mib(memory.get("used_vram")) or 0,
            utilization_pct=_int(usage.get("gfx_activity")),
            temperature_c=hot if hot is not None else _int(temperature.get("edge")),
            power_w=_number(power.get("socket_power")),
            ecc_volatile_uncorrected=uncorrected, ecc_aggregate_uncorrected=uncorrected,
            pcie_replay_count=_int(pcie.get("replay_count"))))
    return out


def parse_hl_smi_csv(text: str) -> list[GpuSample]:
    """Gaudi devices from ``hl-smi -Q <HL_SMI_FIELDS> -f csv,noheader,nounits``."""
    out: list[GpuSample] = []
    for row in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in row]
        if len(cells) < len(HL_SMI_FIELDS) or _int(cells[0]) is None:
            continue
        v = dict(zip(HL_SMI_FIELDS, cells, strict=False))
        out.append(GpuSample(
            index=int(_int(v["index"]) or 0), uuid=v["uuid"], name=v["name"],
            memory_total_mb=_int(v["memory.total"]) or 0, memory_used_mb=_int(v["memory.used"]) or 0,
            utilization_pct=_int(v["utilization.aip"]), temperature_c=_int(v["temperature.aip"]),
            power_w=_number(v["power.draw"]),
            ecc_volatile_uncorrected=_int(v["ecc.errors.uncorrected.volatile.total"]),
            ecc_aggregate_uncorrected=_int(v["ecc.errors.uncorrected.aggregate.total"])))
    return out


class SmiProbe:
    """A ``HealthProbe`` over a vendor tool: ``argv`` run by ``runner`` (tests pass recorded output), ``parse``
    turning its output into GPUs."""

    def __init__(self, source: str, argv: list[str], parse: Callable[[str], list[GpuSample]], *,
                 runner: Runner | None = None) -> None:
        self.source, self.argv, self.parse = source, argv, parse
        self._runner = runner or _run
        self._said = ""

    def available(self) -> bool:
        """Whether the tool is on this machine (a runner given by a test always is)."""
        return self._runner is not _run or shutil.which(self.argv[0]) is not None

    def read_gpus(self, *, with_events: bool = True) -> GpuReading:
        try:
            gpus = self.parse(self._runner(list(self.argv)))
        except FileNotFoundError:
            return self._none(f"{self.argv[0]} not found")
        except subprocess.CalledProcessError as exc:
            return self._none(f"{self.argv[0]} exited {exc.returncode}: {(exc.stderr or '').strip()[:200]}")
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            return self._none(f"{self.argv[0]} failed: {exc}")
        if not gpus:
            return self._none(f"{self.argv[0]} lists no devices")
        self._said = ""
        return GpuReading(source=self.source, gpus=gpus, message=f"{len(gpus)} GPU(s) via {self.argv[0]}")

    def _none(self, why: str) -> GpuReading:
        if why != self._said:  # once per cause, not every sample
            log.warning("no GPUs: %s", why)
            self._said = why
        return GpuReading(source="none", message=f"no GPUs: {why}")

    def sample(self, node: str) -> NodeSample:
        return take_sample(self, node)

    def close(self) -> None:
        pass


def amd_probe(runner: Runner | None = None) -> SmiProbe:
    return SmiProbe("amd-smi", AMD_SMI, parse_amd_smi_metric, runner=runner)


def gaudi_probe(runner: Runner | None = None) -> SmiProbe:
    return SmiProbe("hl-smi", HL_SMI, parse_hl_smi_csv, runner=runner)
