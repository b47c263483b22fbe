"""Site leases on real servers (bus/sites.py over core/siteleases.py): a leaf site renews its lease in the hub's
``site_leases`` bucket across its link; the hub times renewals by its own clock, declares a silent site lost by
compare-and-set (refused when the site renewed meanwhile), and the returning site is told to fence before it
rejoins under the hub's generation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nats.js.api import StreamConfig

from taugrid.bus import connect, sites
from taugrid.bus.sites import LeaseClock, SiteLease
from taugrid.core.errors import TemporaryError
from taugrid.core.siteleases import Lease, Renewal, judge
from tests.sitebus import start_hub, start_site, stop


async def test_a_site_renews_across_its_link_and_is_fenced_once_the_hub_declares_it_lost(tmp_path: Path) -> None:
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    site_proc, site_port = start_site(tmp_path, "site-a", leaf_port)
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    site = await connect(f"nats://127.0.0.1:{site_port}", name="local-cluster")
    try:
        await hub.js.add_stream(StreamConfig(name="BACKEND", subjects=["backend.>"]))  # what feeds SITE_IN
        await sites.provision_hub(hub, "site-a")
        await sites.provision_site(site, "site-a")
        deadline = time.monotonic() + 20
        while True:  # the leaf link comes up within a second or two
            try:
                first = await sites.renew(site, "site-a", 1)
                break
            except TemporaryError:
                assert time.monotonic() < deadline, "the site never reached the hub"
                await asyncio.sleep(0.2)
        assert first == Renewal(False, 1)
        [(lease, revision)] = (await sites.leases(hub)).values()
        assert lease == SiteLease(1, False)

        # the hub's clock times renewals: first seen counts as never renewed, a new revision as renewed now
        clock = LeaseClock()
        assert clock.observe(await sites.leases(hub), 100.0) == [Lease("site-a", 1, False, None)]
        assert await sites.renew(site, "site-a", 1) == Renewal(False, 1)
        assert clock.observe(await sites.leases(hub), 105.0) == [Lease("site-a", 1, False, 105.0)]
        assert clock.observe(await sites.leases(hub), 109.0) == [Lease("site-a", 1, False, 105.0)]

        # declaring it lost on a revision the site has renewed past is refused: it is not lost
        assert await sites.declare_lost(hub, "site-a", lease, revision) is None
        [(lease, revision)] = (await sites.leases(hub)).values()
        assert await sites.declare_lost(hub, "site-a", lease, revision) == SiteLease(2, True)

        # the site comes back under generation 1: fence first, nothing written; then it rejoins under 2
        assert await sites.renew(site, "site-a", 1) == Renewal(True, 2)
        assert [v for v, _ in (await sites.leases(hub)).values()] == [SiteLease(2, True)]
        await sites.rejoin(site, "site-a", 2)
        assert [v for v, _ in (await sites.leases(hub)).values()] == [SiteLease(2, False)]
        assert await sites.renew(site, "site-a", 2) == Renewal(False, 2)
        # a lost lease is not judged again; the rejoined one is live again
        assert judge([Lease("site-a", 2, False, 200.0), Lease("site-b", renewed=1_500.0)], 1_600.0, timeout=900.0,
                     hub_up_since=0.0).lost == ("site-a",)
    finally:
        await hub.close()
        await site.close()
        stop(site_proc, hub_proc)
