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

Beside the metrics, each vendor's library (``health.vendorlib``: ``amdsmi``, ``pyhlml``) adds its health events
per device (``GpuSample.events``) and the memory pending a reset, where it imports; matched to the tool's devices
by PCI address where both know it, else by index. ``reset_gpu`` is the vendor's own reset, the ``gpu-reset``
repair step on this node: ``amd-smi reset --gpureset --gpu N`` (amd-smi's reset command; ``rocm-smi
--gpureset -d N`` is the tool it replaces) and ``hl-smi -i <PCI address> -r`` (hl-smi's ``--reset-aip`` acts
on one device named by its PCI address). Neither asks whether a process holds the device: the repair runs only
on a drained node (``health.repair``).

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

import msgspec

from taugrid.core.contracts import GpuSample, NodeSample
from taugrid.health.probe import GpuReading, take_sample
from taugrid.health.vendorlib import AmdLibEvents, DeviceHealth, GaudiLibEvents, VendorEvents

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
            index=int(_int(v["index"]) or 0), uuid=v["uuid"], name=v["name"], pci_bus_id=v["bus_id"],
            memory_total_mb=_int(v["memory.total"]) or 0, memory_used_mb=_int(v["memory.used"]) or 0,
            utilization_pct=_int(v["utilization.aip"]), temperature_c=_int(v["temperature.aip"]),
            power_w=_number(v["power.draw"]),
            ecc_volatile_uncorrected=_int(v["ecc.errors.uncorrected.volatile.total"]),
            ecc_aggregate_uncorrected=_int(v["ecc.errors.uncorrected.aggregate.total"])))
    return out


ResetArgv = Callable[[GpuSample], list[str]]


def amd_reset(gpu: GpuSample) -> list[str]:
    return ["amd-smi", "reset", "--gpureset", "--gpu", str(gpu.index)]


def gaudi_reset(gpu: GpuSample) -> list[str]:
    return ["hl-smi", "-i", gpu.pci_bus_id, "-r"] if gpu.pci_bus_id else []


def merge(gpus: list[GpuSample], devices: list[DeviceHealth]) -> list[GpuSample]:
    """The library's per-device health added to the tool's GPUs: by PCI address where both know it, else index."""
    out = list(gpus)
    for dev in devices:
        at = next((i for i, g in enumerate(out) if dev.pci and g.pci_bus_id.lower() == dev.pci.lower()), None)
        if at is None:
            at = next((i for i, g in enumerate(out) if g.index == dev.gpu), None)
        if at is None:
            continue
        g = out[at]
        out[at] = msgspec.structs.replace(
            g, events=[*g.events, *dev.events], pci_bus_id=g.pci_bus_id or dev.pci,
            remapped_rows_pending=g.remapped_rows_pending if dev.rows_pending is None else dev.rows_pending)
    return out


class SmiProbe:
    """A ``HealthProbe`` over a vendor tool: ``argv`` run by ``runner`` (tests pass recorded output), ``parse``
    turning its output into GPUs."""

    def __init__(self, source: str, argv: list[str], parse: Callable[[str], list[GpuSample]], *, vendor: str,
                 reset: ResetArgv, runner: Runner | None = None, events: VendorEvents | None = None) -> None:
        """``reset``: the argv that resets one GPU; ``events``: the vendor library's health events (None: none)."""
        self.source, self.argv, self.parse, self.vendor = source, argv, parse, vendor
        self._reset, self._events = reset, events
        self._runner = runner or _run
        self._said = ""
        self._last: list[GpuSample] = []

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
        if with_events and self._events is not None:  # events are drained: a validation's read leaves them
            gpus = merge(gpus, self._events.read())
        self._last = gpus
        return GpuReading(source=self.source, gpus=gpus, message=f"{len(gpus)} GPU(s) via {self.argv[0]}",
                          vendor=self.vendor)

    def reset_gpu(self, gpu: int) -> tuple[bool, str]:
        """The vendor's reset of one GPU (as last read); (ok, outcome)."""
        found = next((g for g in self._last if g.index == gpu), None)
        argv = self._reset(found) if found is not None else []
        if not argv:
            return False, f"GPU {gpu}: not reset, {self.argv[0]} did not name it (index or PCI address) last read"
        try:
            self._runner(argv)
        except subprocess.CalledProcessError as exc:
            return False, f"{' '.join(argv)} exited {exc.returncode}: {(exc.stderr or '').strip()[:200]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{' '.join(argv)} failed: {exc}"
        return True, f"GPU {gpu} reset ({' '.join(argv)})"

    def _none(self, why: str) -> GpuReading:
        if why != self._said:  # once per cause, not every sample
            log.warning("no GPUs: %s", why)
            self._said = why
        return GpuReading(source="none", message=f"no GPUs: {why}")

    def sample(self, node: str) -> NodeSample:
        return take_sample(self, node)

    def close(self) -> None:
        pass


def amd_probe(runner: Runner | None = None, *, events: VendorEvents | None = None) -> SmiProbe:
    """amd-smi's metrics plus amdsmi's events (``events`` replaces the library reader)."""
    return SmiProbe("amd-smi", AMD_SMI, parse_amd_smi_metric, vendor="amd", reset=amd_reset, runner=runner,
                    events=events if events is not None else AmdLibEvents())


def gaudi_probe(runner: Runner | None = None, *, events: VendorEvents | None = None) -> SmiProbe:
    """hl-smi's metrics plus pyhlml's events (``events`` replaces the library reader)."""
    return SmiProbe("hl-smi", HL_SMI, parse_hl_smi_csv, vendor="intel-gaudi", reset=gaudi_reset, runner=runner,
                    events=events if events is not None else GaudiLibEvents())
