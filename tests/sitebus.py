"""The real servers of the many-cluster tests: a hub (domain ``hub``, listening for leaf nodes) and its leaf sites,
each provisioned on both sides of its link (``sites.provision_site`` and ``provision_hub``), and a site's simulated
local cluster (``TAU_SITE``). Shared by tests/bus (sites, leases), tests/dispatcher and tests/cli/test_clusters_cmd."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.js.api import StreamConfig

from taugrid.bus import connect, platformstore, sites
from taugrid.bus.connection import Bus
from taugrid.bus.errors import MISSING
from taugrid.config.platform import Platform
from taugrid.local.controller import LocalCluster
from taugrid.ports import free_port
from taugrid.settings import Settings
from taugrid.stack import natsserver
from taugrid.stack.natsserver import Leaf

Proc = subprocess.Popen[bytes]


def start_hub(tmp_path: Path) -> tuple[Proc, int, int]:
    """The hub's server: (its process, its client port, the port it listens on for leaf nodes)."""
    leaf_port = free_port()
    proc, port = natsserver.start(tmp_path / "hub", log_file=tmp_path / "hub.log",
                                  leaf=Leaf(sites.HUB_DOMAIN, listen_port=leaf_port))
    return proc, port, leaf_port


def stop(*procs: Proc) -> None:
    """Stop the servers that still run."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)


def start_site(tmp_path: Path, name: str, leaf_port: int, port: int | None = None) -> tuple[Proc, int]:
    """A site's leaf server (domain ``name``) linked to the hub, with the link's deny lists; ``port`` to restart
    one on its port and store."""
    return natsserver.start(tmp_path / name, port=port, log_file=tmp_path / f"{name}.log",
                            leaf=Leaf(name, hub_url=f"nats-leaf://127.0.0.1:{leaf_port}",
                                      deny_exports=sites.SITE_DENY_EXPORTS, deny_imports=sites.SITE_DENY_IMPORTS))


async def link(hub: Bus, port: int, name: str) -> Bus:
    """A connection to site ``name``'s server, its streams made on both sides of the link."""
    site = await connect(f"nats://127.0.0.1:{port}", name="local-cluster")
    try:
        await hub.js.stream_info("BACKEND")
    except MISSING:  # a hub the test did not bootstrap: the stream the site's requests come from
        await hub.js.add_stream(StreamConfig(name="BACKEND", subjects=["backend.>"]))
    await sites.provision_feed(hub, name)  # the hub's durable its SITE_IN sources
    await sites.provision_site(site, name)
    await sites.provision_hub(hub, name)
    return site


async def site_cluster(site: Bus, tmp_path: Path, name: str, platform_text: str) -> LocalCluster:
    """Site ``name``'s simulated local cluster (4 CPUs, no GPU), admitting by ``platform_text`` stored at the site."""
    await platformstore.put_text(site, platform_text)
    cluster = LocalCluster(site, data_dir=tmp_path / f"{name}-data", node=f"{name}-node",
                           capacity={"cpu": 4.0, "memory": float(8 << 30)}, gpu_count=0,
                           given=Settings.from_env({"TAU_SITE": "on", "TAU_CLUSTER": name,
                                                    "TAU_LOCAL_SIMULATE": "on"}))
    await cluster.load()
    return cluster


def fixed(platform: Platform) -> Callable[[], Awaitable[Platform]]:
    """The dispatcher's platform source, always ``platform``."""

    async def get() -> Platform:
        return platform

    return get


async def fed(hub: Bus, platform: Platform) -> Callable[[], Awaitable[Platform]]:
    """``fixed(platform)``, each of its clusters' feeds made on ``hub`` first (``sites.provision_feed``, as the
    sites' provisioning does): the dispatcher nominates no cluster without one, and BACKEND, an interest-retention
    stream, holds a cluster's requests for its feed (no site reads it here: they stay for the test to read)."""
    for cluster in platform.clusters:
        await sites.provision_feed(hub, cluster.name)
    return fixed(platform)
