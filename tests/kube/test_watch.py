"""Watcher over real HTTP (kmock): list+watch, resume, 410 relist diff, drops, bookmarks, dedup, backoff."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from taugrid.core.contracts import WatchEvent
from taugrid.core.errors import PermanentError
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.watch import MANAGED_SELECTOR, Watcher

JOBS = ("batch", "v1", "jobs")
NODES = ("", "v1", "nodes")


def job(name: str, *, managed: bool = True, active: int = 0) -> dict[str, Any]:
    labels = {"taugrid.io/managed-by": "taugrid"} if managed else {"app": "other"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "team-a", "labels": labels},
        "spec": {"suspend": True},
        "status": {"active": active},
    }


def watcher(api_client: Any, **kw: Any) -> Watcher:
    api = KubeApi(api_client, retries=0)
    return Watcher(
        api,
        resource_for("Job"),
        cluster="prod",
        label_selector=MANAGED_SELECTOR,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        **kw,
    )


class Collector:
    """Runs a watcher in a task, collecting events."""

    def __init__(self, w: Watcher) -> None:
        self.w = w
        self.events: list[WatchEvent] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for ev in self.w:
            self.events.append(ev)

    def seen(self) -> list[tuple[str, str]]:
        return [(e.type, e.object["metadata"]["name"]) for e in self.events]

    async def until(self, cond: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not cond():
                if self.task.done():
                    self.task.result()
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def test_lists_then_watches_managed_objects_only(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.put(JOBS, job("a"))
    fake.put(JOBS, job("foreign", managed=False))
    c = Collector(watcher(api_client))
    try:
        await c.until(lambda: len(c.events) == 1)
        assert c.seen() == [("ADDED", "a")]
        assert c.events[0].cluster == "prod" and c.events[0].object["kind"] == "Job"
        fake.modify(JOBS, "team-a", "a", lambda o: o["status"].update(active=1))
        fake.put(JOBS, job("b"))
        fake.remove(JOBS, "team-a", "a")
        await c.until(lambda: len(c.events) == 4)
        assert c.seen() == [("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
        assert c.w.resource_version == str(fake.rv)
        params = fake.watch_requests[0]
        assert params["allowWatchBookmarks"] == "true" and params["labelSelector"] == MANAGED_SELECTOR
        assert params["resourceVersion"] == "102"  # from the list, not the first object
    finally:
        await c.stop()


async def test_resumes_from_a_persisted_resource_version_without_relisting(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.put(JOBS, job("old"))  # rv 101: handled before the restart
    checkpoint = str(fake.rv)
    fake.modify(JOBS, "team-a", "old", lambda o: o["status"].update(active=1))  # 102, while we were down
    c = Collector(watcher(api_client, resource_version=checkpoint))
    try:
        await c.until(lambda: len(c.events) == 1)
        assert c.seen() == [("MODIFIED", "old")]
        assert fake.watch_requests[0]["resourceVersion"] == checkpoint
        assert c.w.relists == 0
    finally:
        await c.stop()


async def test_gone_relists_and_emits_what_changed_meanwhile(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    for name in ("keep", "change", "vanish"):
        fake.put(JOBS, job(name))
    c = Collector(watcher(api_client))
    try:
        await c.until(lambda: len(c.events) == 3)
        fake.drop_watches()  # the connection breaks first, so nothing below reaches the old stream
        fake.modify(JOBS, "team-a", "change", lambda o: o["status"].update(active=1))
        fake.remove(JOBS, "team-a", "vanish")
        fake.put(JOBS, job("new"))
        fake.compact()  # the resourceVersion the watcher holds is gone → 410 on resume
        await c.until(lambda: len(c.events) == 6)
        assert sorted(c.seen()[3:]) == [("ADDED", "new"), ("DELETED", "vanish"), ("MODIFIED", "change")]
        assert c.w.relists == 2 and c.w.resource_version == str(fake.rv)
        deleted = next(e for e in c.events if e.type == "DELETED")
        assert deleted.object["metadata"]["name"] == "vanish"  # the last known object
        fake.put(JOBS, job("after"))  # and the watch carries on from the relist
        await c.until(lambda: c.seen()[-1] == ("ADDED", "after"))
    finally:
        await c.stop()


async def test_dropped_connection_loses_no_transition(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.put(JOBS, job("a"))
    c = Collector(watcher(api_client))
    try:
        await c.until(lambda: len(c.events) == 1)
        await c.until(lambda: len(fake.watches) == 1)  # the ADDED came from the list: wait for the watch itself
        fake.drop_watches()
        fake.modify(JOBS, "team-a", "a", lambda o: o["status"].update(active=1))
        fake.modify(JOBS, "team-a", "a", lambda o: o["status"].update(active=0, succeeded=1))
        fake.remove(JOBS, "team-a", "a")
        await c.until(lambda: len(c.events) == 4)
        await asyncio.sleep(0.1)
        assert c.seen() == [("ADDED", "a"), ("MODIFIED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
        assert [e.object["metadata"]["resourceVersion"] for e in c.events] == ["101", "102", "103", "104"]
        assert len(fake.watch_requests) >= 2 and fake.watch_requests[-1]["resourceVersion"] == "101"
        assert c.w.relists == 1
    finally:
        await c.stop()


async def test_bookmarks_advance_the_resource_version(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.put(JOBS, job("a"))
    c = Collector(watcher(api_client))
    try:
        await c.until(lambda: len(c.events) == 1)
        await c.until(lambda: len(fake.watches) == 1)  # a bookmark reaches only an open watch
        for i in range(3):  # other kinds move the cluster's resourceVersion on
            fake.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}"}})
        fake.bookmark()
        await c.until(lambda: c.w.resource_version == str(fake.rv))
        assert len(c.events) == 1  # a bookmark is not an event
    finally:
        await c.stop()


async def test_replayed_events_are_deduplicated_by_uid_and_resource_version(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    obj = fake.put(JOBS, job("a"))
    c = Collector(watcher(api_client))
    try:
        await c.until(lambda: len(c.events) == 1)
        fake._emit(JOBS, "MODIFIED", obj)  # the same (uid, resourceVersion) again
        fake.modify(JOBS, "team-a", "a", lambda o: o["status"].update(active=1))
        await c.until(lambda: len(c.events) >= 2)
        await asyncio.sleep(0.05)
        assert c.seen() == [("ADDED", "a"), ("MODIFIED", "a")]
    finally:
        await c.stop()


async def test_api_errors_back_off_and_recover(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.put(JOBS, job("a"))
    fake.fail("GET", 503, "apiserver is shutting down", times=3)
    c = Collector(watcher(api_client))
    try:
        await c.until(lambda: len(c.events) == 1)
        assert c.seen() == [("ADDED", "a")]
    finally:
        await c.stop()


async def test_forbidden_list_is_permanent(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.fail("GET", 403, 'jobs.batch is forbidden: User "kube-bridge" cannot list resource "jobs"')
    with pytest.raises(PermanentError, match="cannot list"):
        async with asyncio.timeout(5):
            async for _ in watcher(api_client):
                pass
