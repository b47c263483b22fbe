"""``envelope.from_message`` reads a kept copy's source header inline (a replay's per-event path) exactly as
``envelope.sourced`` does: the RUNS subject and sequence of a copy of RUNS' message, else the copy's own."""

from __future__ import annotations

import pytest

from taugrid.bus.envelope import SOURCE_HEADER, from_message, sourced

RUNS_SUBJECT = "run.vision.r1.exec.running"


@pytest.mark.parametrize(("origin", "expected"), [
    (f"RUNS 7 run.*.*.*.* h.$1.$2 {RUNS_SUBJECT} x1", (RUNS_SUBJECT, 7)),
    (f"RUNS:C=abc 12 run.*.*.*.* h.$1.$2 {RUNS_SUBJECT} x1", (RUNS_SUBJECT, 12)),
    (f"RUNS:C=abc 12 run.*.*.*.* h.$1.$2 {RUNS_SUBJECT} an id with blanks", (RUNS_SUBJECT, 12)),
    (f"RUNS 5 run.*.*.*.* h.$1.$2 {RUNS_SUBJECT}", (RUNS_SUBJECT, 5)),  # no id: five tokens are enough
    (f"RUNSX 7 run.*.*.*.* h.$1.$2 {RUNS_SUBJECT} x1", ("h.vision.r1", 3)),  # another stream's copy
    (f"RUNSX:C=abc 7 run.*.*.*.* h.$1.$2 {RUNS_SUBJECT} x1", ("h.vision.r1", 3)),
    (f"OTHER:C=abc 7 run.*.*.*.* h.$1.$2 {RUNS_SUBJECT} x1", ("h.vision.r1", 3)),
    (f"RUNS x7 run.*.*.*.* h.$1.$2 {RUNS_SUBJECT} x1", ("h.vision.r1", 3)),  # no sequence number
    ("RUNS 7 run.*.*.*.* h.$1.$2", ("h.vision.r1", 3)),  # too short to name a subject
])
def test_a_copys_source_header_reads_as_sourced_reads_it(origin: str, expected: tuple[str, int]) -> None:
    ev = from_message("h.vision.r1", {SOURCE_HEADER: origin, "Nats-Msg-Id": "m1"}, b"{}", seq=3)
    assert (ev.nats_subject, ev.seq) == expected
    assert sourced(origin, "h.vision.r1", 3) == expected
