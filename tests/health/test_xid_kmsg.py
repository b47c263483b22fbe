"""The XID catalogue and kernel-log parsing, on lines as dmesg, journald and /dev/kmsg print them."""

from __future__ import annotations

import os

from taugrid.health.kmsg import KmsgReader, parse_kernel_log, parse_xid_line, pci_key
from taugrid.health.xid import APP_XIDS, classify, describe


def test_fatal_xids_need_reset_or_drain_and_app_xids_are_not_node_faults() -> None:
    for code in (48, 64, 74, 79, 95, 119, 120):
        assert classify(code).severity >= 3, code
    for code in (63, 94):
        assert classify(code).severity == 2, code  # reset pending: cordon, reset when idle
    for code in (13, 31, 43, 45, 68):
        assert classify(code).severity == 0 and code in APP_XIDS
    assert classify(79).bucket == "RESTART_BM"
    assert classify(9999).severity == 1 and classify(9999).mnemonic == "unknown XID"
    assert "fallen off the bus" in describe(79)


def test_parses_dmesg_journal_and_kmsg_formats() -> None:
    text = "\n".join([
        "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1896, GPU has fallen off the bus.",
        "Jun 01 12:00:00 gpu-7 kernel: NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row "
        "marked for remapping, reset gpu to activate.",
        "6,4711,987654321,-;NVRM: Xid (PCI:0000:b1:00): 13, pid='<unknown>', name=<unknown>, Graphics "
        "Exception: ESR 0x404600",
        "[ 1.0] nvidia-nvlink: Nvlink Core is being initialized",
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=77, name=python3, DBE (0x1) has been detected.",
    ])
    recs = parse_kernel_log(text)
    assert [(r.bdf, r.xid, r.pid) for r in recs] == [
        ("0000:3b:00", 79, 1896), ("0000:10:1c", 63, 1896), ("0000:b1:00", 13, None), ("0000:3b:00", 48, 77)]
    assert recs[0].detail == "GPU has fallen off the bus."
    assert recs[3].detail == "DBE (0x1) has been detected."
    assert recs[2].detail.startswith("Graphics Exception")


def test_odd_lines_yield_nothing_and_never_raise() -> None:
    for line in ["", "NVRM: Xid", "NVRM: Xid (PCI:zz): x, pid=1", "random kernel noise", "\x00\xff"]:
        assert parse_xid_line(line) is None


def test_pci_addresses_from_kmsg_and_nvml_compare_equal() -> None:
    assert pci_key("0000:3b:00") == pci_key("00000000:3B:00.0") == "0:3b:00"
    assert pci_key("0001:3b:00") != pci_key("0000:3b:00")


def test_kmsg_reader_is_optional(tmp_path) -> None:
    assert KmsgReader.open_if_readable(str(tmp_path / "missing")) is None
    # A readable file in kmsg format stands in for /dev/kmsg: one record per read.
    path = tmp_path / "kmsg"
    path.write_text("6,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    reader = KmsgReader.open_if_readable(str(path), lookback_s=1e12)
    assert reader is not None
    try:
        assert [r.xid for r in reader.read_new()] == [79]
    finally:
        reader.close()
    if os.access("/dev/kmsg", os.R_OK):  # only where this user may read the real one
        real = KmsgReader.open_if_readable()
        assert real is not None
        real.read_new(max_records=50)
        real.close()
