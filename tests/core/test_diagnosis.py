"""tau diagnose's decision: the cause a person would name first, and the next step, for each way a run ends."""

from __future__ import annotations

from taugrid.core.contracts import Issue, RecoveryGaveUp, ResolvedRun, Resources
from taugrid.core.diagnosis import RunFacts, diagnose, signal_name
from taugrid.core.states import RunRecord

RUN = ResolvedRun(run_id="r-1", submission_id="s", workspace="ws", namespace="ns", name="r",
                  limits=Resources(memory=2 << 30), active_deadline_s=3600)


def record(**kw) -> RunRecord:  # type: ignore[no-untyped-def]
    return RunRecord(run_id="r-1", workspace="ws", resolved=RUN, **kw)


def test_signal_names_follow_the_shells_128_plus_n() -> None:
    assert (signal_name(137), signal_name(139), signal_name(1), signal_name(None), signal_name(200)) == (
        "SIGKILL", "SIGSEGV", "", "", "")


def test_a_script_error_names_its_exit_code_and_the_retry_hint() -> None:
    d = diagnose(record(state="failed", reason="Error", exit_code=3, node="n1"),
                 RunFacts(gave_up=RecoveryGaveUp(reason="Error", classification="app_error", attempts=1,
                                                 hint="add Error to resilience.retry_on to retry crashes"),
                          last_lines=["Traceback", "ValueError: bad lr"], node_verdict="healthy"))
    assert (d.classification, d.cause) == ("app_error", "the script exited with code 3")
    assert d.next_step == ("add Error to resilience.retry_on to retry crashes; fix the error its last lines show, "
                           "then `tau run retry r-1 --from .` in the project folder")
    assert d.facts == {"state": "failed", "attempts": "1", "reason": "Error", "exit code": "3",
                       "node": "n1 (now healthy)"}
    assert d.last_lines == ["Traceback", "ValueError: bad lr"]


def test_sizes_read_alike_in_diagnose_and_status() -> None:
    """One formatter (core/quantity.human_bytes): diagnose's limit reads as the OOM message tau status shows."""
    import msgspec

    from taugrid.core.quantity import human_bytes
    from taugrid.local.containers import exit_reason

    small = msgspec.structs.replace(RUN, limits=Resources(memory=200 << 20))
    d = diagnose(RunRecord(run_id="r-1", workspace="ws", resolved=small, state="failed", reason="OOMKilled",
                           exit_code=137), RunFacts())
    assert d.cause == "killed for using more memory than its limit of 200 MiB (OOMKilled)"
    assert exit_reason(137, stopped=False, memory_limit=200 << 20) == (
        "OOMKilled", "killed by SIGKILL inside the container's memory limit (200 MiB)")
    assert [human_bytes(n) for n in (512, 1536, 200 << 20, 3 << 29, 1 << 40, 100 << 30)] == [
        "512 B", "1.5 KiB", "200 MiB", "1.5 GiB", "1 TiB", "100 GiB"]


def test_a_gpu_fault_is_the_platforms_not_the_scripts_even_with_a_non_zero_exit() -> None:
    d = diagnose(record(state="failed", reason="Error", exit_code=1, node="n2", attempt=2, exclude_nodes=["n2"]),
                 RunFacts(degraded=[("n2", "GpuXid", "XID 79 on GPU 0")], node_verdict="unhealthy"))
    assert (d.classification, d.cause) == ("gpu_fault", "a fault of node n2 (GpuXid: XID 79 on GPU 0), not of "
                                                        "the script")
    assert d.facts["node faults"] == "n2: GpuXid" and d.facts["avoided nodes"] == "n2"


def test_oom_names_the_limit() -> None:
    d = diagnose(record(state="failed", reason="OOMKilled", exit_code=137), RunFacts())
    assert (d.classification, d.cause) == ("oom", "killed for using more memory than its limit of 2 GiB (OOMKilled)")
    assert d.facts["signal"] == "SIGKILL"
    # the next step runs the edited tau.yaml: a plain retry or resume would run the old limit and be killed again
    assert d.next_step == ("raise compute.memory_limit in tau.yaml (or use less memory, e.g. a smaller batch); then "
                           "`tau run retry r-1 --from .` in the project folder (`tau run resume r-1 --from .` to "
                           "start from its last checkpoint)")


def test_a_gpu_fault_or_a_cancel_runs_again_as_it_was() -> None:
    gpu = diagnose(record(state="failed", reason="GpuFault", node="n2"), RunFacts())
    assert gpu.next_step.endswith("raise it, or `tau run retry r-1` (the node is avoided)")
    assert diagnose(record(state="cancelled"), RunFacts()).next_step == "`tau run retry r-1` runs it again"


def test_a_kill_signal_preemption_deadline_rejection_and_cancel() -> None:
    assert diagnose(record(state="failed", reason="Error", exit_code=139), RunFacts()).cause == (
        "the script was killed by SIGSEGV (exit code 139)")
    pre = diagnose(record(state="failed", reason="Preempted"), RunFacts(preempted_by=["big-run", "big-run"]))
    assert (pre.cause, pre.facts["preempted"]) == ("preempted by big-run and not retried", "2× (big-run)")
    assert diagnose(record(state="failed", reason="DeadlineExceeded"), RunFacts()).cause == (
        "ran past its deadline (3600 s)")
    rej = diagnose(record(state="rejected"), RunFacts(rejected=[Issue("compute.gpus", "asks 9 GPUs", "ask ≤ 8")]))
    assert (rej.cause, rej.next_step) == ("rejected before it ran: compute.gpus: asks 9 GPUs",
                                          "ask ≤ 8; then `tau run validate` and submit again")
    assert diagnose(record(state="cancelled", cancelled_by="ada"), RunFacts()).cause == "cancelled by ada"
    assert diagnose(record(state="succeeded"), RunFacts()).cause == "it succeeded"
    assert diagnose(record(state="queued", message="waiting for quota"), RunFacts()).cause == (
        "it has not finished: queued (waiting for quota)")
