"""`tau clusters` against a real hub and leaf: a provisioned site whose link is up reads ``ok`` with its lag, the
runs it holds, and the capacity and usage its local cluster reported (written again only when they change); a
declared cluster the hub has no stream for reads ``no link`` and no capacity; `tau queue` on the hub shows the
control plane's quota view, the site's share named; without clusters the command says runs go to the stack's own
backend."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from taugrid.bus import connect, kv, platformstore, sitecapacity, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.cli.clusters_cmd import clusters_view
from taugrid.cli.queue_cmd import clusters_queue_view
from taugrid.client.clusters import cluster_rows, quota_view
from taugrid.config.platform import load_platform
from taugrid.core.contracts import BackendDelete
from taugrid.core.sitecapacity import FlavorCapacity, QueueShare, SiteCapacity
from taugrid.core.states import RunRecord
from taugrid.runrecord.read import list_records
from tests.dispatcher.test_site_reservations import run_request
from tests.platforms import lab_platform
from tests.sitebus import site_cluster, start_hub, start_site, stop

# site-a holds 1 CPU of lab where the platform's lab has 8 (its own quota, ``siteplatform.for_cluster``)
CLUSTERS = [{"name": "site-a", "backend": "local",
             "quotas": [{"cluster_queue": "lab", "flavor": "default", "resources": {"cpu": "1"}}]},
            {"name": "cloud", "backend": "kubernetes", "preference": 5, "cluster_queues": ["lab"]}]


def tau(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TAU_NATS_URL": url}
    return subprocess.run([sys.executable, "-m", "taugrid.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=60)


async def test_each_cluster_shows_its_link_lag_runs_capacity_and_usage(tmp_path: Path) -> None:
    hub, hub_port, leaf_port = start_hub(tmp_path)
    site, site_port = start_site(tmp_path, "site-a", leaf_port)
    url = f"nats://127.0.0.1:{hub_port}"
    hub_bus = await connect(url, name="bootstrap")
    site_bus = await connect(f"nats://127.0.0.1:{site_port}", name="local-cluster")
    local = None
    try:
        await bootstrap(hub_bus)
        text = lab_platform(clusters=CLUSTERS)
        await platformstore.put_text(hub_bus, text)
        await sites.provision_hub(hub_bus, "site-a")
        await sites.provision_site(site_bus, "site-a")
        # the site's local cluster: one reservation holds its own 1 CPU of quota, the next waits
        local = await site_cluster(site_bus, tmp_path, "site-a", text)
        for run in ("r5", "r6"):
            await local.apply(run_request(run, seconds=60.0), hold=True)
        await local.tick()
        assert {n: wl.state for n, wl in local.wls.items()} == {"r5-a1": "reserved", "r6-a1": "pending"}
        deadline = time.monotonic() + 30
        while True:  # the first renewal and report cross once the link is up
            try:
                await local.lease_pass()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        first = await kv.get(hub_bus, sitecapacity.BUCKET, "site-a")
        await local.lease_pass()  # nothing changed: nothing written
        assert first is not None and (await kv.get(hub_bus, sitecapacity.BUCKET, "site-a")) == first
        assert (await sitecapacity.reports(hub_bus, ["site-a", "cloud"])) == {"site-a": SiteCapacity(
            nodes=1, cpu=None, memory=float(8 << 30), flavors=[sitecapacity_flavor()],
            queues=[QueueShare("lab", nominal={"cpu": 1.0, "memory": float(16 << 30)},
                               used={"cpu": 1.0, "memory": float(64 << 20)}, admitted=1, pending=1,
                               first_pending=["r6"])])}
        await site_bus.publish("k8s.site-a.Workload.ns.w1.modified", b"{}", event_type="modified",
                               ce_subject="r1", msg_id="w1", family="k8s")
        for run, state, cluster in (("r1", "running", "site-a"), ("r2", "admitted", "site-a"),
                                    ("r3", "succeeded", "site-a"), ("r4", "running", "")):
            await kv.put(hub_bus, "run_state", f"run.ws.{run}",
                         RunRecord(run_id=run, workspace="ws", state=state, cluster=cluster))
        platform = load_platform(text)
        deadline = time.monotonic() + 30
        while ((rows := await cluster_rows(hub_bus, platform, await list_records(hub_bus)))[0].health != "ok"
               and time.monotonic() < deadline):
            await asyncio.sleep(0.2)
        assert [(r.name, r.health, r.lease, r.lag, r.runs, r.cluster_queues) for r in rows] == [
            ("site-a", "ok", "gen 1", 0, 2, None), ("cloud", "no link", "-", None, 0, ["lab"])]
        shown = clusters_view(rows).splitlines()
        assert shown[0].split() == ["CLUSTER", "BACKEND", "PREFERENCE", "HEALTH", "LEASE", "LAG", "RUNS",
                                    "CAPACITY", "USAGE", "QUEUES"]
        assert shown[1].split() == ["site-a", "local", "0", "ok", "gen", "1", "0", "2", "1", "node,", "cpu",
                                    "shared", "cpu", "1/1,", "memory", "0.0625Gi/16Gi;", "1", "admitted,", "1",
                                    "pending", "all"]
        assert shown[2].split() == ["cloud", "kubernetes", "5", "no", "link", "-", "-", "0", "-", "-", "lab"]

        done = await asyncio.to_thread(tau, url, "clusters", "--output", "json")
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)["clusters"]
        assert [(c["name"], c["health"], c["lease"], c["runs"], c["usage"]) for c in got] == [
            ("site-a", "ok", "gen 1", 2, {"nominal": {"cpu": 1.0, "memory": float(16 << 30)},
                                          "used": {"cpu": 1.0, "memory": float(64 << 20)}, "admitted": 1,
                                          "pending": 1}),
            ("cloud", "no link", "-", 0, None)]
        assert (got[0]["capacity"]["nodes"], got[1]["capacity"]) == (1, None)

        # `tau queue` on this hub (the command is run on a whole stack in tests/e2e/test_clusters.py)
        view = await quota_view(hub_bus, platform)
        assert view is not None
        reported, totals = view
        assert list(reported) == ["site-a"]
        shown_queue = clusters_queue_view(totals, show_pending=5, silent=["cloud"])
        assert [line.split() for line in shown_queue.splitlines()] == [
            ["CLUSTERQUEUE", "CLUSTER", "NOMINAL", "USED", "ADMITTED", "PENDING"],
            ["lab", "all", "cpu=1", "memory=16.0Gi", "cpu=1", "memory=0.1Gi", "1", "1"],
            ["lab", "site-a", "cpu=1", "memory=16.0Gi", "cpu=1", "memory=0.1Gi", "1", "1"],
            ["lab", "at", "site-a", "#1:", "r6"],
            ["(no", "report", "yet", "from", "cloud)"],
            ["(summed", "over", "the", "clusters", "serving", "each", "queue,", "as", "each", "last", "reported:",
             "`tau", "clusters`", "shows", "each", "link's", "health)"]]

        # a change is reported at the next pass: r5 withdrawn, r6 takes the quota and nothing waits
        async with local.lock:
            await local.delete(BackendDelete(run_id="r5", workspace="default", attempt=1, kind="Job",
                                             namespace="default", name="r5-a1", reason="withdrawn"))
        await local.tick()
        await local.lease_pass()
        second = await kv.get(hub_bus, sitecapacity.BUCKET, "site-a")
        assert second is not None and second.revision > first.revision
        [share] = (await sitecapacity.reports(hub_bus, ["site-a"]))["site-a"].queues
        assert (share.admitted, share.pending, share.first_pending, share.used["cpu"]) == (1, 0, [], 1.0)

        await platformstore.put_text(hub_bus, yaml.safe_dump({**yaml.safe_load(text), "clusters": []}))
        plain = await asyncio.to_thread(tau, url, "clusters")
        assert plain.returncode == 0, plain.stderr
        assert plain.stdout.strip() == ("no clusters declared: runs go to this stack's own backend (platform.yaml "
                                        "clusters, docs §13d)")
    finally:
        if local is not None:
            await local.kubelet.close()
        await hub_bus.close()
        await site_bus.close()
        stop(hub, site)


def sitecapacity_flavor() -> FlavorCapacity:
    """The lab platform's one flavor (no node labels) selects the site's one node, whose CPU is time-shared."""
    return FlavorCapacity("default", nodes=1, gpus=0.0, cpu=None)


def test_a_silent_link_and_one_never_reached_are_named() -> None:
    from taugrid.bus.sites import Link
    from taugrid.client.clusters import health

    assert health(Link(lag=3, silent_s=45.2, stored=9)) == "silent 45s"
    assert health(Link(lag=0, silent_s=None, stored=0)) == "never reached"
    assert health(None) == "no link"
    assert health(Link(lag=0, silent_s=1.0, stored=1)) == "ok"


def test_a_lease_reads_held_lost_or_not_yet() -> None:
    from taugrid.bus.sites import SiteLease
    from taugrid.client.clusters import lease_view

    assert lease_view(SiteLease(1)) == "gen 1"
    assert lease_view(SiteLease(2, lost=True)) == "lost (gen 2)"
    assert lease_view(None) == "-"


def test_help_says_what_it_shows() -> None:
    done = subprocess.run([sys.executable, "-m", "taugrid.cli.main", "clusters", "--help"], capture_output=True,
                          text=True, timeout=60)
    shown = " ".join(done.stdout.split())
    assert done.returncode == 0 and "health of each link, lease (lost: its runs were requeued elsewhere), lag" in shown


async def test_a_stack_that_runs_no_sites_keeps_its_own_queue_view(private_bus: Bus) -> None:
    """Clusters applied but not started (a local stack before its restart, or the chart, which starts no sites):
    no site_capacity bucket, so `tau queue` keeps the stack's own backend's snapshot; provisioned, the hub's."""
    platform = load_platform(lab_platform(clusters=CLUSTERS))
    assert await quota_view(private_bus, platform) is None
    assert await quota_view(private_bus, load_platform(lab_platform())) is None
    await sitecapacity.provision_hub(private_bus)
    assert await quota_view(private_bus, platform) == ({}, [])
