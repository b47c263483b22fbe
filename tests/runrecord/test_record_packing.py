"""The projection's record encoding: a record's resolved run is encoded once, and the bytes stored are exactly
``wirejson.encode``'s (``RecordCache.packed``)."""

from __future__ import annotations

import msgspec

from taugrid.core import wirejson
from taugrid.core.contracts import ResolvedRun, Resources
from taugrid.core.states import Phase, RunRecord
from taugrid.runrecord import RecordCache


def resolved(name: str) -> ResolvedRun:
    return ResolvedRun(run_id="r-1", submission_id="s1", workspace="team-a", namespace="default", name=name,
                       command=["python3", "train.py"], resources=Resources(cpu=1.0), env={"A": "1"})


def test_a_record_is_stored_as_wirejson_writes_it_whether_its_resolved_run_is_new_or_known() -> None:
    cache = RecordCache(size=2)
    record = RunRecord(run_id="r-1", workspace="team-a", state="queued", phases=[Phase(name="submitted")])
    assert cache.packed(record) == wirejson.encode(record)  # no resolved run yet
    record.resolved = resolved("first")
    assert cache.packed(record) == wirejson.encode(record)
    record.state, record.last_seq = "running", 7  # a later event of the run: its resolved run is the same object
    assert cache.packed(record) == wirejson.encode(record)
    assert msgspec.json.decode(cache.packed(record), type=RunRecord) == record
    record.resolved = resolved("second")  # a new resolved run (a refold, another policy.approved): its own JSON
    assert cache.packed(record) == wirejson.encode(record)
    assert b'"name":"second"' in cache.packed(record)
    # its history, written by msgspec at once: the same bytes, an earlier release's entries (more keys) too
    record.history = [{"seq": 3, "type": "submit.requested", "attempt": 1, "time": "2026-12-02T18:00:00Z",
                       "applied": True},
                      {"seq": 9, "type": "exec.progress", "attempt": 1, "time": "", "applied": False,
                       "pods": [{"name": "p-0", "phase": None}], "note": {"x": 1.5}}]
    assert cache.packed(record) == wirejson.encode(record)
    assert msgspec.json.decode(cache.packed(record), type=RunRecord) == record


def test_the_resolved_runs_kept_are_bounded_by_the_cache_size() -> None:
    cache = RecordCache(size=2)
    records = [RunRecord(run_id=f"r-{i}", workspace="w", resolved=resolved(f"n{i}")) for i in range(5)]
    for record in records:
        assert cache.packed(record) == wirejson.encode(record)
    assert len(cache._resolved) == 2
