"""bench/slurm_peer.py's parts that need no Slurm: the slurm.conf it writes and the verdict it prints."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def peer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # as when the script runs: its directory first on sys.path
    return importlib.import_module("slurm_peer")


def settings(text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith(("NodeName=", "PartitionName="))]
    return dict(ln.split("=", 1) for ln in lines)


def test_slurm_conf_keeps_every_file_and_port_private_and_declares_the_node(peer: ModuleType, tmp_path: Path) -> None:
    text = peer.slurm_conf(tmp_path, ctld_port=16001, slurmd_port=16002, munge_socket=tmp_path / "m.sock", cpus=64)
    conf = settings(text)
    assert conf["SlurmctldHost"] == "localhost" and conf["ClusterName"] == "taubench"
    assert (conf["SlurmctldPort"], conf["SlurmdPort"]) == ("16001", "16002")
    assert conf["AuthInfo"] == f"socket={tmp_path / 'm.sock'}"
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile",
                "SlurmdLogFile"):
        assert Path(conf[key]).is_relative_to(tmp_path), key
    assert (conf["SelectType"], conf["SelectTypeParameters"]) == ("select/cons_tres", "CR_Core")
    assert (conf["ProctrackType"], conf["TaskPlugin"]) == ("proctrack/linuxproc", "task/none")
    assert conf["SlurmdParameters"] == "config_overrides"  # the declared 64 CPUs, not the machine's
    assert "SchedulerParameters" not in conf  # Slurm's default scheduler unless asked
    node = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    assert node == ["NodeName=localhost CPUs=64 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=1 "
                    "RealMemory=1000 State=UNKNOWN"]
    assert [ln for ln in text.splitlines() if ln.startswith("PartitionName=")] == [
        "PartitionName=bench Nodes=localhost Default=YES MaxTime=INFINITE State=UP"]


def test_slurm_conf_carries_scheduler_parameters_when_given(peer: ModuleType, tmp_path: Path) -> None:
    text = peer.slurm_conf(tmp_path, ctld_port=1, slurmd_port=2, munge_socket=tmp_path / "s", cpus=8,
                           scheduler_parameters="batch_sched_delay=0")
    assert settings(text)["SchedulerParameters"] == "batch_sched_delay=0"
    assert "CPUs=8 " in text


def side(peer: ModuleType, name: str, *, starts: list[float | None], idle_ms: list[float]) -> object:
    s = peer.Side(name)
    s.burst_submitted = [(f"j{i}", 100.0) for i in range(len(starts))]
    s.burst_started = {f"j{i}": at for i, at in enumerate(starts) if at is not None}
    s.burst_gave_up = 200.0
    s.idle_ms = idle_ms
    return s


def test_taugrid_ahead_on_burst_and_idle_p99_passes(peer: ModuleType) -> None:
    slurm = side(peer, "Slurm", starts=[101.0, 110.0], idle_ms=[900.0, 3000.0])  # 2 jobs in 10 s
    tau = side(peer, "taugrid", starts=[100.5, 101.0], idle_ms=[50.0, 200.0])  # 2 jobs in 1 s
    rows, ok = peer.compare(slurm, tau)
    assert ok
    assert rows[0][1:] == ("0.2", "2.0", "ahead of Slurm", "ok")
    assert rows[1][1:3] == ("10.0", "1.0")
    assert rows[3][1:] == ("3000", "200", "ahead of Slurm", "ok")


def test_behind_on_idle_p99_fails(peer: ModuleType) -> None:
    slurm = side(peer, "Slurm", starts=[110.0], idle_ms=[100.0, 150.0])
    tau = side(peer, "taugrid", starts=[101.0], idle_ms=[50.0, 400.0])
    rows, ok = peer.compare(slurm, tau)
    assert not ok and rows[3][4] == "MISSED" and rows[0][4] == "ok"


def test_a_run_that_never_started_counts_until_the_bench_gave_up_and_fails(peer: ModuleType) -> None:
    slurm = side(peer, "Slurm", starts=[300.0], idle_ms=[3000.0])
    tau = side(peer, "taugrid", starts=[101.0, None], idle_ms=[50.0])
    assert tau.burst_figures() == {"jobs_per_s": 2 / 100.0, "all_started_s": 100.0}  # gave up at 200
    rows, ok = peer.compare(slurm, tau)
    assert not ok
    assert rows[4][1:] == ("0 / 0 of 2", "1 / 0 of 3", "none", "MISSED")


def test_the_time_to_all_submitted_is_a_row_of_its_own(peer: ModuleType) -> None:
    slurm = side(peer, "Slurm", starts=[101.0], idle_ms=[100.0])
    tau = side(peer, "taugrid", starts=[101.0], idle_ms=[50.0])
    slurm.burst_submit_s, tau.burst_submit_s = 6.25, 1.5
    rows, _ = peer.compare(slurm, tau)
    assert rows[5] == ("burst: time to all submitted (s)", "6.2", "1.5", "", "")


def test_slurm_phases_come_from_its_logs_as_medians(peer: ModuleType, tmp_path: Path) -> None:
    import datetime as dt

    def at(text: str) -> float:
        return dt.datetime.fromisoformat(text).timestamp()

    (tmp_path / "slurmctld.log").write_text(
        "[2026-12-01T18:46:50.889] _slurm_rpc_submit_batch_job: JobId=1 InitPrio=1 usec=476\n"
        "[2026-12-01T18:46:52.000] sched: Allocate JobId=1 NodeList=localhost #CPUs=1 Partition=bench\n"
        "[2026-12-01T18:46:52.500] sched: Allocate JobId=2 NodeList=localhost #CPUs=1 Partition=bench\n"
        "[2026-12-01T18:46:53.000] sched: Allocate JobId=3 NodeList=localhost #CPUs=1 Partition=bench\n")
    (tmp_path / "slurmd.log").write_text(
        "[2026-12-01T18:47:00.000] Launching batch job 1 for UID 0\n"
        "[2026-12-01T18:47:02.500] Launching batch job 2 for UID 0\n"
        "[2026-12-01T18:47:13.000] Launching batch job 3 for UID 0\n")
    s = peer.Side("Slurm")
    s.burst_submitted = [("1", at("2026-12-01T18:46:51")), ("2", at("2026-12-01T18:46:51")),
                         ("3", at("2026-12-01T18:46:51"))]
    s.burst_started = {"1": at("2026-12-01T18:47:00.250"), "2": at("2026-12-01T18:47:03")}  # job 3 never started
    phases = peer.slurm_phases(tmp_path, s)
    assert phases == {"submit → allocated": pytest.approx(1.5), "allocated → launched": pytest.approx(10.0),
                      "launched → started": pytest.approx(0.5)}
