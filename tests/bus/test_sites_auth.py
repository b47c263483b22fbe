"""On an authenticated server, the dispatcher's identity may pull from its durable on a site's hub stream and no
other service may (the durable is made by the bootstrap identity through ``sites.provision_hub``)."""

from __future__ import annotations

import pytest

from taugrid.bus import sites
from taugrid.core.errors import PermissionDenied


async def test_only_the_dispatcher_pulls_from_a_sites_hub_stream(secure_nats):  # type: ignore[no-untyped-def]
    boot = await secure_nats.connect("bootstrap")
    dispatcher = await secure_nats.connect("dispatcher")
    renderer = await secure_nats.connect("renderer")
    try:
        await sites.provision_hub(boot, "site-z")
        sub = await dispatcher.guarded(dispatcher.js.pull_subscribe_bind(sites.DISPATCHER_DURABLE,
                                                                         stream=sites.hub_stream("site-z")))
        with pytest.raises(Exception) as empty:  # nothing sourced yet: the pull is allowed and times out
            await dispatcher.guarded(sub.fetch(1, timeout=0.5))
        assert not isinstance(empty.value, PermissionDenied), empty.value
        theirs = await renderer.js.pull_subscribe_bind(sites.DISPATCHER_DURABLE, stream=sites.hub_stream("site-z"))
        with pytest.raises(PermissionDenied, match="consumer.msg.next.site_site_z.dispatcher"):
            await renderer.guarded(theirs.fetch(1, timeout=2))
    finally:
        for bus in (boot, dispatcher, renderer):
            await bus.close()


async def test_the_dispatcher_may_ask_whether_a_clusters_feed_exists_and_no_more(secure_nats):  # type: ignore[no-untyped-def]
    """It nominates no cluster without a feed (BACKEND, an interest-retention stream, would not keep its request):
    the info of BACKEND's consumers is its to read, but for the other services' durables there."""
    boot = await secure_nats.connect("bootstrap")
    dispatcher = await secure_nats.connect("dispatcher")
    renderer = await secure_nats.connect("renderer")
    try:
        assert not await sites.feed_exists(dispatcher, "site-y")
        await sites.provision_feed(boot, "site-y")
        assert await sites.feed_exists(dispatcher, "site-y")
        with pytest.raises(PermissionDenied, match="consumer.info.backend.local-cluster"):
            await dispatcher.guarded(dispatcher.js.consumer_info("BACKEND", "local-cluster"))
        with pytest.raises(PermissionDenied, match="consumer.info.backend.site-y-in"):
            await renderer.guarded(renderer.js.consumer_info("BACKEND", "site-y-in"))
    finally:
        for bus in (boot, dispatcher, renderer):
            await bus.close()
