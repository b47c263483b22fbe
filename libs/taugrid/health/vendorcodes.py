"""Vendor health codes as data: (vendor, raw code) → component, kind, action, and the node condition it raises.

Every vendor's reader (``health.vendorlib`` for AMD's amdsmi and Gaudi's pyhlml) turns what its library reports
into ``GpuEvent`` through ``event`` here, so the rules (``health.rules``) and the repair ladders
(``health.repair``) see one shape whichever vendor spoke. The actions are one scale for every vendor (the same as
``health.xid``'s severities):

* ``none`` (0): an event only, the node is fine (a corrected error, a clock change);
* ``alert`` (1): a condition for a human, nothing drains;
* ``reset`` (3): cordon and drain, reset the GPU, validate (uncorrectable ECC, a fatal RAS record, a critical
  event);
* ``reboot`` (4): cordon and drain, reboot the node, validate;
* ``rma`` (4): cordon and drain, the GPU needs replacing (``GpuRmaRequired``, whose ladder is ``replace-node``):
  AMD's bad-page table past its threshold, a bad page the driver could not reserve.

Codes are the vendors' own names: amdsmi's ``AmdSmiGpuBlock`` names for per-block ECC, ``AMDSMI_CPER_SEV_*``
severities of RAS records (CPER) whose AMD field ids (AFIDs) ride along in ``code``, ``AMDSMI_MEM_PAGE_STATUS_*``
for bad pages; pyhlml's ``HLML_EVENT_*`` bits and ``HLML_ROW_REPLACEMENT_CAUSE_*``. A code not in the table is an
``alert``: surfaced for a human, never a drain on its own. No AFID has an action of its own yet: AMD's list of
AFIDs and their service actions is not public in a form this table could be checked against, so a CPER record's
action follows its severity and its AFIDs are kept as the raw code.
"""

from __future__ import annotations

from typing import NamedTuple

from taugrid.core.contracts import GpuEvent

SEVERITY = {"none": 0, "alert": 1, "reset": 3, "reboot": 4, "rma": 4}


class Meaning(NamedTuple):
    component: str
    kind: str
    action: str  # none | alert | reset | reboot | rma
    condition: str  # the node condition raised ("" for action none)


# amdsmi's AmdSmiGpuBlock members (less INVALID and RESERVED): the blocks whose ECC counts it reports.
AMD_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "ATHUB", "PCIE_BIF", "HDP", "XGMI_WAFL", "DF", "SMN", "SEM", "MP0", "MP1",
              "FUSE", "MCA", "VCN", "JPEG", "IH", "MPIO")
_ECC = "GpuEccUncorrectable"
_FATAL = "GpuFatalError"
_RMA = "GpuRmaRequired"
_EVENT = "GpuVendorEvent"

TABLE: dict[tuple[str, str], Meaning] = {
    # AMD, amdsmi_get_gpu_ecc_count(handle, AmdSmiGpuBlock.<block>): an uncorrectable count rising in a block;
    # a deferred error is an uncorrectable one whose poisoned data was not consumed yet: the same reset.
    **{("amd", f"AMDSMI_GPU_BLOCK_{block} {kind}_count"): Meaning(block.lower(), f"ecc-{kind}", "reset", _ECC)
       for block in AMD_BLOCKS for kind in ("uncorrectable", "deferred")},
    # AMD, amdsmi_get_gpu_cper_entries: RAS records (CPER) by their error_severity.
    ("amd", "AMDSMI_CPER_SEV_FATAL"): Meaning("device", "ras-fatal", "reset", _FATAL),
    ("amd", "AMDSMI_CPER_SEV_NON_FATAL_UNCORRECTED"): Meaning("device", "ras-uncorrected", "reset", _ECC),
    ("amd", "AMDSMI_CPER_SEV_NON_FATAL_CORRECTED"): Meaning("device", "ras-corrected", "none", ""),
    # AMD, amdsmi_get_gpu_bad_page_info / _threshold: retired VRAM pages.
    ("amd", "AMDSMI_MEM_PAGE_STATUS_RESERVED"): Meaning("memory", "page-retired", "none", ""),
    ("amd", "AMDSMI_MEM_PAGE_STATUS_UNRESERVABLE"): Meaning("memory", "page-unreservable", "rma", _RMA),
    ("amd", "bad-page-threshold"): Meaning("memory", "bad-page-threshold", "rma", _RMA),
    # Gaudi, hlmlEventSetWait after hlmlDeviceRegisterEvents: the event_type bits (ECC_ERR and ECC_DERR are one
    # bit, as are DRAM_ERR and DRAM_DERR: double-bit, uncorrectable).
    ("intel-gaudi", "HLML_EVENT_ECC_DERR"): Meaning("sram", "ecc-uncorrectable", "reset", _ECC),
    ("intel-gaudi", "HLML_EVENT_DRAM_DERR"): Meaning("hbm", "ecc-uncorrectable", "reset", _ECC),
    ("intel-gaudi", "HLML_EVENT_CRITICAL_ERR"): Meaning("device", "critical", "reset", _FATAL),
    ("intel-gaudi", "HLML_EVENT_ECC_SERR"): Meaning("sram", "ecc-corrected", "none", ""),
    ("intel-gaudi", "HLML_EVENT_DRAM_SERR"): Meaning("hbm", "ecc-corrected", "none", ""),
    ("intel-gaudi", "HLML_EVENT_CLOCK_RATE"): Meaning("device", "clock-rate", "none", ""),
    # Gaudi, hlmlDeviceGetReplacedRowsCount(device, cause): HBM rows replaced by a spare (a reset applies the
    # pending ones: hlmlDeviceGetReplacedRowsPendingStatus, read as remapped_rows_pending).
    ("intel-gaudi", "HLML_ROW_REPLACEMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"): Meaning("hbm", "row-replaced", "alert", _EVENT),
    ("intel-gaudi", "HLML_ROW_REPLACEMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"): Meaning(
        "hbm", "row-replaced", "none", ""),
}
UNKNOWN = Meaning("device", "unknown", "alert", _EVENT)


def meaning(vendor: str, code: str) -> Meaning:
    """What ``code`` of ``vendor`` means; a code not in the table is an alert (a human looks, nothing drains)."""
    return TABLE.get((vendor, code), UNKNOWN)


def event(vendor: str, code: str, *, gpu: int, pci: str = "", detail: str = "", raw: str = "") -> GpuEvent:
    """The normalised event for one vendor code on one device; ``raw`` replaces ``code`` as the raw code kept
    (a CPER record's severity with its AFIDs), ``detail`` says what the reader saw."""
    m = meaning(vendor, code)
    severity = SEVERITY[m.action]
    what = f"{vendor} GPU {gpu}{f' ({pci})' if pci else ''}: {m.kind} in {m.component} ({raw or code})"
    return GpuEvent(vendor=vendor, gpu=gpu, pci=pci, component=m.component, kind=m.kind, severity=severity,
                    action=m.action, condition=m.condition, code=raw or code,
                    message=f"{what}{'; ' + detail if detail else ''}; action: {m.action}")
