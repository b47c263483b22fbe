"""Many clusters end to end (issue 28 item 5, the small version): `tau up --platform` with a platform naming three
local clusters starts a hub, a leaf server and a simulated local cluster per cluster, and the dispatcher. Runs go
through the whole pipeline to one cluster each; `tau clusters` shows the three links (and, at the end, each
site's capacity and usage; `tau queue` the quota summed over the three). One cluster's server is then
frozen (SIGSTOP: its link and its lease renewals stop, its local cluster still runs) while runs are running there;
after ``dispatch.worker_lost_timeout`` (10 s: a renewal every 2.5 s, so a loaded machine does not lose a cluster
that runs) its runs are requeued on the others, and every run ends exactly once, once the cut cluster is back
(SIGCONT) and has fenced too."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.bus import sites
from taugrid.bus.connection import connect
from taugrid.client import open_client
from taugrid.core.ids import new_submission_id
from tests.e2e.conftest import TEST_PLATFORM, Stack, reachable_dir, write_project

CLUSTERS = ("east", "west", "north")
PLATFORM = TEST_PLATFORM + """clusters:
  - {name: east, backend: local}
  - {name: west, backend: local}
  - {name: north, backend: local, preference: 1}
dispatch: {worker_lost_timeout: 10}
"""
RUNS = 6
RUN_SECONDS = 20  # long enough that the cut lands while they run, on a loaded machine too
TERMINAL = ("exec.succeeded", "exec.failed", "recovery.gave_up", "exec.cancelled")


@pytest.fixture(scope="module")
def sites_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    d = reachable_dir("tau-e2e-clusters-")
    try:
        s = Stack(d, tmp_path_factory.mktemp("operator"))
        platform = tmp_path_factory.mktemp("platform") / "platform.yaml"
        platform.write_text(PLATFORM.replace("{outputs}", str(d / "outputs")))
        s.tau("up", "--platform", str(platform), check=True, timeout=180)
        yield s
        s.tau("down", timeout=60)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _clusters(s: Stack) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in s.json("clusters")["clusters"]}


def _wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


async def _submit(s: Stack, text: str, n: int) -> list[str]:
    """``n`` runs of ``text`` submitted by the stack's person through one client connection."""
    client = await open_client(s.state()["nats_url"], creds=Path(s.state()["user_creds"]))
    try:
        return [await client.submit_text(text, workspace="default", submission_id=new_submission_id(),
                                          name="multi") for _ in range(n)]
    finally:
        await client.close()


def _leases(s: Stack) -> dict[str, sites.SiteLease]:
    async def read() -> dict[str, sites.SiteLease]:
        hub = await connect(s.state()["nats_url"], name="e2e", creds=s.data_dir / "creds" / "bootstrap.nk")
        try:
            return {name: lease for name, (lease, _) in (await sites.leases(hub)).items()}
        finally:
            await hub.close()

    return asyncio.run(read())


def test_runs_go_to_one_cluster_each_and_a_cut_clusters_runs_end_once_elsewhere(sites_stack: Stack,
                                                                                  tmp_path: Path) -> None:
    s = sites_stack
    state = s.state()
    assert [site["name"] for site in state["sites"]] == list(CLUSTERS)
    assert {svc["service"] for svc in state["services"]} >= {"dispatcher", "local_cluster"}
    assert sorted(svc["replica"] for svc in state["services"] if svc["service"] == "local_cluster") == [0, 1, 2]
    rows = _wait("three links up", lambda: (r := _clusters(s)) and all(
        r[c]["health"] == "ok" for c in CLUSTERS) and r, 60)
    assert [(r["name"], r["backend"], r["preference"]) for r in rows.values()] == [
        ("east", "local", 0), ("west", "local", 0), ("north", "local", 1)]

    config = write_project(tmp_path, "multi", "print('hi')\n",
                           f"name: multi\nentrypoint: main.py\n"
                           f"runtime: {{env: {{SIMULATED_DURATION: '{RUN_SECONDS}'}}}}\n")
    runs = [s.tau("run", str(config), check=True).stdout.split()[-1]]  # one through the CLI, as a person does
    runs += asyncio.run(_submit(s, config.read_text(), RUNS - 1))  # the others at once: they run together

    def all_running() -> dict[str, str] | None:
        listed = {r["run_id"]: r for r in s.json("list", "--limit", "100")["runs"]}
        now = [listed.get(run) or {} for run in runs]
        if any(r.get("state") in ("succeeded", "failed") for r in now):
            raise AssertionError(f"a run ended before all ran: {now}")
        return {run: r["cluster"] for run, r in zip(runs, now, strict=True)} if all(
            r.get("state") == "running" and r.get("cluster") for r in now) else None

    first = _wait("every run running", all_running, 120)
    assert set(first.values()) <= set(CLUSTERS)
    # usage per cluster, as `tau clusters` counts it
    assert {c: r["runs"] for c, r in _clusters(s).items()} == {c: list(first.values()).count(c) for c in CLUSTERS}

    victim = Counter(first.values()).most_common(1)[0][0]
    cut = [run for run, cluster in first.items() if cluster == victim]
    pid = next(site["nats_pid"] for site in state["sites"] if site["name"] == victim)
    os.kill(pid, signal.SIGSTOP)
    try:
        ended = {run: s.wait_state(run, {"succeeded", "failed"}, timeout=120) for run in runs}
        lost = _leases(s)[victim]
        shown = _clusters(s)[victim]["lease"]
    finally:
        os.kill(pid, signal.SIGCONT)
    assert lost == sites.SiteLease(generation=2, lost=True)
    assert shown == "lost (gen 2)"
    assert {run: r["state"] for run, r in ended.items()} == dict.fromkeys(runs, "succeeded")
    for run in cut:  # requeued on another cluster and ended there
        assert ended[run]["cluster"] != victim, run
    for run in set(runs) - set(cut):
        assert ended[run]["cluster"] == first[run], run

    # the cut cluster comes back, is told to fence (its orphans stopped) and rejoins under the hub's generation
    _wait(f"{victim} rejoined", lambda: _leases(s)[victim] == sites.SiteLease(generation=2), 60)
    assert {c: r["lease"] for c, r in _clusters(s).items()} == {c: "gen 2" if c == victim else "gen 1"
                                                                 for c in CLUSTERS}
    # each site's capacity and usage (reported on change) and the hub's quota view, summed over the three: the
    # runs over, nothing is held anywhere, the cut site's orphans included
    def idle_view() -> dict[str, Any] | None:
        view = s.json("queue")
        return view if [(q["cluster_queue"], q["admitted"], q["pending"], [sh["cluster"] for sh in q["shares"]])
                        for q in view["queues"]] == [("local", 0, 0, ["east", "west", "north"])] else None

    view = _wait("every cluster's usage back to none", idle_view, 30)
    assert view["queues"][0]["nominal"] == {"cpu": 3 * 64.0, "memory": 3 * 64.0 * 2**30, "nvidia.com/gpu": 6.0}
    assert {c: (r["capacity"]["nodes"], r["usage"]["admitted"]) for c, r in _clusters(s).items()} == dict.fromkeys(
        CLUSTERS, (1, 0))
    time.sleep(3)  # what the returning site reports now must change nothing
    for run in runs:
        events = [e["short_type"] for e in s.wait_sealed(run)]
        assert [e for e in events if e in TERMINAL] == ["exec.succeeded"], (run, events)
        assert events.count("evidence.sealed") == 1, (run, events)
        chosen = [e for e in s.events(run) if e["short_type"] == "dispatch.chosen"]
        if run in cut:
            withdrawn = [e for e in s.events(run) if e["short_type"] == "dispatch.withdrawn"
                         and "lost" in json.dumps(e)]
            assert len(chosen) == 2 and len(withdrawn) == 1, (run, chosen, withdrawn)
        else:
            assert len(chosen) == 1, (run, chosen)
