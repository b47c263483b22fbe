"""The portal's queues page on a hub with clusters: each cluster's share of each ClusterQueue it serves, as its
site last reported it, in preference order, another workspace's waiting run counted but not named; the portal's
own identity may read the sites' records (it reads every bucket)."""

from __future__ import annotations

from taugrid.access import permissions
from taugrid.bus import kv, platformstore, sitecapacity
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.client.access import Viewer
from taugrid.core.sitecapacity import QueueShare, SiteCapacity
from taugrid.core.states import RunRecord
from taugrid_services.portal import reads
from tests.platforms import lab_platform

CLUSTERS = [{"name": "east", "backend": "local", "preference": 1}, {"name": "west", "backend": "local"},
            {"name": "south", "backend": "local"}]


async def test_a_hubs_queues_page_shows_each_clusters_share(private_bus: Bus) -> None:
    await bootstrap(private_bus)
    await platformstore.put_text(private_bus, lab_platform(clusters=CLUSTERS))
    await sitecapacity.provision_hub(private_bus)
    for cluster, share in (("east", QueueShare("lab", nominal={"cpu": 8.0}, used={"cpu": 2.0}, admitted=2,
                                               pending=3, first_pending=["mine", "theirs"])),
                           ("west", QueueShare("lab", nominal={"cpu": 4.0}))):
        await kv.put(private_bus, sitecapacity.BUCKET, cluster, SiteCapacity(nodes=1, queues=[share]))
    await kv.put(private_bus, "run_state", "run.ws.mine", RunRecord(run_id="mine", workspace="ws", state="queued"))

    got = await reads.queues(private_bus, Viewer("eve", "U" + "A" * 55, "researcher", ("ws",)))
    assert got == {"time": None, "clusters": ["east", "west"], "queues": [
        {"cluster_queue": "lab @ west", "cohort": "", "nominal": {"cpu": 4.0}, "used": {}, "borrowed": {},
         "lent": {}, "admitted": 0, "pending_count": 0, "pending": []},
        {"cluster_queue": "lab @ east", "cohort": "", "nominal": {"cpu": 8.0}, "used": {"cpu": 2.0}, "borrowed": {},
         "lent": {}, "admitted": 2, "pending_count": 3,
         "pending": [{"run_id": "mine", "workload": "", "position": 0},
                     {"run_id": "", "workload": "", "position": 1}]}]}


def test_the_portal_may_read_the_sites_records() -> None:
    portal = permissions.SERVICE_ROLES["portal"]
    granted = permissions.service_permissions(portal, "U" + "P" * 55).publish
    assert "$JS.API.DIRECT.GET.KV_site_capacity.>" in granted
