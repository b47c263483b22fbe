"""`tau clusters` against a real hub and leaf: a provisioned site whose link is up reads ``ok`` with its lag and the
runs it holds; a declared cluster the hub has no stream for reads ``no link``; without clusters the command says
runs go to the stack's own backend."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from taugrid.bus import connect, kv, platformstore, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.cli.clusters_cmd import clusters_view
from taugrid.client.clusters import cluster_rows
from taugrid.config.platform import load_platform
from taugrid.core.states import RunRecord
from taugrid.runrecord.read import list_records
from tests.platforms import lab_platform
from tests.sitebus import start_hub, start_site, stop

CLUSTERS = [{"name": "site-a", "backend": "local"}, {"name": "cloud", "backend": "kubernetes", "preference": 5,
                                                       "cluster_queues": ["lab"]}]


def tau(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TAU_NATS_URL": url}
    return subprocess.run([sys.executable, "-m", "taugrid.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=60)


async def test_each_cluster_shows_its_link_lag_and_runs(tmp_path: Path) -> None:
    hub, hub_port, leaf_port = start_hub(tmp_path)
    site, site_port = start_site(tmp_path, "site-a", leaf_port)
    url = f"nats://127.0.0.1:{hub_port}"
    hub_bus = await connect(url, name="bootstrap")
    site_bus = await connect(f"nats://127.0.0.1:{site_port}", name="local-cluster")
    try:
        await bootstrap(hub_bus)
        text = lab_platform(clusters=CLUSTERS)
        await platformstore.put_text(hub_bus, text)
        await sites.provision_hub(hub_bus, "site-a")
        await sites.provision_site(site_bus, "site-a")
        await sites.renew(site_bus, "site-a", 1)
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
        assert shown[0].split() == ["CLUSTER", "BACKEND", "PREFERENCE", "HEALTH", "LEASE", "LAG", "RUNS", "QUEUES"]
        assert shown[1].split() == ["site-a", "local", "0", "ok", "gen", "1", "0", "2", "all"]
        assert shown[2].split() == ["cloud", "kubernetes", "5", "no", "link", "-", "-", "0", "lab"]

        done = await asyncio.to_thread(tau, url, "clusters", "--output", "json")
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)["clusters"]
        assert [(c["name"], c["health"], c["lease"], c["runs"]) for c in got] == [
            ("site-a", "ok", "gen 1", 2), ("cloud", "no link", "-", 0)]

        await platformstore.put_text(hub_bus, yaml.safe_dump({**yaml.safe_load(text), "clusters": []}))
        plain = await asyncio.to_thread(tau, url, "clusters")
        assert plain.returncode == 0, plain.stderr
        assert plain.stdout.strip() == ("no clusters declared: runs go to this stack's own backend (platform.yaml "
                                        "clusters, docs §13d)")
    finally:
        await hub_bus.close()
        await site_bus.close()
        stop(hub, site)


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
