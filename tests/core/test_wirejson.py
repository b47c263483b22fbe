"""A run event's body is stored without its fields at their defaults and reads back as the same Struct."""

from __future__ import annotations

import msgspec

from taugrid.core import wirejson
from taugrid.core.contracts import (
    ContainerReport,
    ExecFinished,
    ExecRunning,
    GangPod,
    PhaseReport,
    PodSetTopology,
    PolicyApproved,
    Resilience,
    ResolvedRun,
    Resources,
)
from taugrid.core.events import RUN_EVENTS
from taugrid.core.states import Phase, PodView, RunRecord


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


def _left_out_by_the_rule(value: object) -> object:
    """The rule the module docstring states, walked the plain way: a field is left out when it equals its default
    and is of the default's type, or equals a fresh value of its default factory."""
    if isinstance(value, msgspec.Struct):
        out = {}
        for f in msgspec.structs.fields(type(value)):
            field = getattr(value, f.name)
            if f.default is not msgspec.NODEFAULT and field == f.default and type(field) is type(f.default):
                continue
            if f.default_factory is not msgspec.NODEFAULT and field == f.default_factory():
                continue
            out[f.encode_name] = _left_out_by_the_rule(field)
        return out
    if isinstance(value, (list, tuple)):
        return [_left_out_by_the_rule(v) for v in value]
    if isinstance(value, dict):
        return {k: _left_out_by_the_rule(v) for k, v in value.items()}
    return value


def test_a_run_record_with_pods_phases_and_history_leaves_out_exactly_its_defaults() -> None:
    """The run record is encoded at each of its run's events (the run_state bucket): the quick walk must give the
    bytes the rule gives, for every kind of field it holds (nested Structs, lists of them, dicts of scalars and of
    lists, None where a default is not None, 0 where the default is 0.0)."""
    record = RunRecord(
        run_id="hello-3f2a9c", workspace="team-a", name="hello", state="succeeded", created=1.5, updated=0,
        finished=None, exit_code=0, position=None, exclude_nodes=["n1"], resolved=resolved(),
        environment={"PATH": "/bin"}, last_seq=41,
        phases=[Phase(name="submitted", status="done", started=1.0, finished=2.0), Phase(name="policy")],
        pods=[PodView(name="p-0", node="vm", phases=[Phase(name="scheduling", status="done", detail="node vm")],
                      containers=[ContainerReport(name="main", state="terminated", exit_code=0)]), PodView(name="p-1")],
        topology=[PodSetTopology(pod_set="main", levels=["rack"], domains=[])],
        history=[{"seq": 1, "type": "submit.requested", "attempt": 1, "time": "t", "applied": True},
                 {"seq": 2, "nested": {"a": [1, {"b": None}]}, "list": [[], {}]}])
    expected = msgspec.json.encode(_left_out_by_the_rule(record))
    assert wirejson.encode(record) == expected
    top = msgspec.json.decode(expected)
    assert (top["updated"], "position" in top, "finished" in top, top["pods"][1]) == (0, False, False, {"name": "p-1"})
    assert msgspec.json.decode(wirejson.encode(record), type=RunRecord) == record


def test_a_resolved_runs_checkpoint_directories_are_left_out_when_they_follow_from_its_output_directory() -> None:
    """issue 27: ``checkpoint_dir`` is ``<output_dir>/checkpoints`` and ``resilience.checkpoint_path`` the checkpoint
    directory unless the config or a resume says otherwise; stored, they are left out then and read back whole."""
    out = "/data/runs/team-a/hello-3f2a9c"
    run = resolved(output_dir=out)
    assert (run.checkpoint_dir, run.resilience.checkpoint_path) == (f"{out}/checkpoints", f"{out}/checkpoints")
    compact = wirejson.encode(run)
    assert b"checkpoint" not in compact and b'"resilience"' not in compact
    assert msgspec.json.decode(compact, type=ResolvedRun) == run
    # written out where they say something else: a resume point (the rest of resilience at its defaults), a
    # checkpoint directory of its own (as a test or an earlier release may have it)
    resumed = resolved(output_dir=out, resilience=Resilience(max_retries=2, checkpoint_path="/data/runs/team-a/x/c"))
    assert (b'"resilience":{"max_retries":2,"checkpoint_path":"/data/runs/team-a/x/c"}' in wirejson.encode(resumed)
            and msgspec.json.decode(wirejson.encode(resumed), type=ResolvedRun) == resumed)
    retried = resolved(output_dir=out, resilience=Resilience(max_retries=2))
    assert retried.resilience.checkpoint_path == f"{out}/checkpoints"
    assert b'"resilience":{"max_retries":2}' in wirejson.encode(retried)
    assert msgspec.json.decode(wirejson.encode(retried), type=ResolvedRun) == retried
    own = resolved(output_dir=out, checkpoint_dir="/data/runs/team-a/ckpt")
    assert (b'"checkpoint_dir":"/data/runs/team-a/ckpt"' in wirejson.encode(own)
            and own.resilience.checkpoint_path == "/data/runs/team-a/ckpt"
            and msgspec.json.decode(wirejson.encode(own), type=ResolvedRun) == own)
    # an earlier release's event, every field written out, reads the same
    assert msgspec.json.decode(msgspec.json.encode(run), type=ResolvedRun) == run


def test_a_running_events_pod_and_node_are_left_out_when_they_are_its_first_listed_pods() -> None:
    """issue 27: a gang's first pod's ``exec.running`` lists the pods that started with it, itself first; stored, its
    own pod and node are left out then and read back from that first pod, and written out where they differ."""
    gang = [GangPod(name="r-a1-0", node="vm"), GangPod(name="r-a1-1", node="n2", index=1)]
    cases = [
        (ExecRunning(node="vm", pod="r-a1-0", pods=gang),
         b'{"pods":[{"name":"r-a1-0","node":"vm"},{"name":"r-a1-1","node":"n2","index":1}]}'),
        (ExecRunning(node="n2", pod="r-a1-1", pods=gang),
         b'{"node":"n2","pod":"r-a1-1","pods":[{"name":"r-a1-0","node":"vm"},{"name":"r-a1-1","node":"n2","index":1}]}'),
        (ExecRunning(pod="r-a1-0", pods=gang[:1]), b'{"pod":"r-a1-0","pods":[{"name":"r-a1-0","node":"vm"}]}'),
        (ExecRunning(node="vm", pod="r-a1-0"), b'{"node":"vm","pod":"r-a1-0"}'),
        (ExecRunning(), b"{}"),
    ]
    for value, stored in cases:
        assert wirejson.encode(value) == stored
        assert msgspec.json.decode(stored, type=ExecRunning) == value
    # an earlier release's event, every field written out, reads the same
    assert msgspec.json.decode(msgspec.json.encode(cases[0][0]), type=ExecRunning) == cases[0][0]
