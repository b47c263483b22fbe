"""Follow every container of every tau pod through the pod log API and publish its lines onto LOGS.

Same subjects, payload and chunking as the local backend: ``log.<ws>.<run>.<attempt>``, one ``LogChunk`` of
complete lines (at most ``MAX_CHUNK_BYTES``) per flush, ``pod`` = the pod name and ``seq`` counting the pod's
chunks, so ``tau logs`` and the evidence bundle read Kubernetes logs unchanged. A pod's containers are
shipped in the order they run (init containers, then the others), all under the pod's one ``seq``.

Exactly once across restarts: each pod's ``Position`` lives in the ``log_shipper`` KV (``pod.<uid>``) and
every write is a compare-and-set. Before a chunk is published its size is recorded (``pending``); after, the
position moves past it. A shipper that dies in between resumes from the old position, rebuilds exactly the
same chunk (same lines, same ``seq``) and publishes it with the same ``Nats-Msg-Id`` (``<pod>.<seq>``), which
the LOGS stream drops if it was stored (dedup window 120 s). Streams resume with ``sinceTime`` and skip the
lines the position says were shipped (``taugrid.kube.podlogs.Filter``).

Pods are found by list+watch of tau-labelled Pods (``taugrid.kube.watch.Watcher``); a deleted pod's position
is deleted. The pod objects, not the log streams, say when a container has finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.core.contracts import LogChunk
from taugrid.core.errors import NotFound, PermanentError, TauError, TemporaryError
from taugrid.core.events import log_subject
from taugrid.core.ids import token
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.podlogs import Filter, Position, container_state, containers, run_of, since_param, split_line
from taugrid.kube.translate import traceparent_of
from taugrid.kube.watch import MANAGED_SELECTOR, Watcher

log = logging.getLogger("taugrid.log_shipper")

BUCKET = "log_shipper"
MAX_CHUNK_BYTES = 256 * 1024  # as the local backend (taugrid.local.pods.MAX_LOG_CHUNK)
_END = object()


def position_key(uid: str) -> str:
    return f"pod.{token(uid)}"


class LogShipper:
    """``await shipper.start()`` … ``await shipper.stop()``; ``api`` is a ``KubeApi`` or a kubernetes-asyncio
    ``ApiClient`` (wrapped). ``namespaces`` empty = every namespace."""

    def __init__(
        self,
        api: Any,
        bus: Bus,
        *,
        namespaces: list[str] | None = None,
        flush_s: float = 0.25,
        retry_s: float = 0.5,
    ) -> None:
        self.api: KubeApi = api if isinstance(api, KubeApi) else KubeApi(api)
        self.bus = bus
        self.namespaces: list[str | None] = [*sorted({n for n in namespaces or [] if n})] or [None]
        self.flush_s, self.retry_s = flush_s, retry_s
        self.pods: dict[str, dict[str, Any]] = {}  # uid → latest pod object
        self.changed: dict[str, asyncio.Event] = {}
        self.followers: dict[str, asyncio.Task[None]] = {}
        self.watches: list[asyncio.Task[None]] = []
        self.published = 0

    async def start(self) -> None:
        resource = resource_for("Pod")
        for ns in self.namespaces:
            watcher = Watcher(self.api, resource, namespace=ns, label_selector=MANAGED_SELECTOR)
            self.watches.append(asyncio.create_task(self._watch(watcher), name=f"log-shipper-watch-{ns}"))

    async def wait(self, stopping: asyncio.Event) -> None:
        """Until ``stopping`` is set; re-raises the error of a pod watch that gave up (a PermanentError)."""
        stop = asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait([stop, *self.watches], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        for task in self.watches:
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def stop(self) -> None:
        tasks = [*self.watches, *self.followers.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.watches.clear()
        self.followers.clear()

    # ---------------------------------------------------------------- pods

    async def _watch(self, watcher: Watcher) -> None:
        async for ev in watcher:
            meta = ev.object.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            if not uid or run_of(ev.object) is None:
                continue
            if ev.type == "DELETED":
                self.pods.pop(uid, None)
                task = self.followers.pop(uid, None)
                if task is not None:
                    task.cancel()
                self.changed.pop(uid, None)
                with contextlib.suppress(TauError):
                    await kv.delete(self.bus, BUCKET, position_key(uid))
                continue
            self.pods[uid] = ev.object
            self.changed.setdefault(uid, asyncio.Event()).set()
            task = self.followers.get(uid)
            if task is None or task.done():
                self.followers[uid] = asyncio.create_task(self._follow_pod(uid), name=f"logs-{meta.get('name')}")

    async def _follow_pod(self, uid: str) -> None:
        """Ship the pod's containers in order until all are done; failures retry from the stored position."""
        while uid in self.pods:
            try:
                if await self._ship_pod(uid):
                    return
            except (NotFound, PermanentError) as exc:
                if uid not in self.pods:
                    return
                log.info("log-shipper: %s; retrying", exc)  # e.g. 400 while a container is being created
            except TemporaryError as exc:
                log.warning("log-shipper: %s", exc)
            await asyncio.sleep(self.retry_s)

    async def _ship_pod(self, uid: str) -> bool:
        position, revision = await kv.load(self.bus, BUCKET, position_key(uid), Position)
        position = position or Position()
        names = containers(self.pods[uid])
        while not position.done:
            if position.container >= len(names):
                position = Position(container=position.container, seq=position.seq, done=True)
                revision = await kv.save(self.bus, BUCKET, position_key(uid), position, revision=revision)
                break
            name = names[position.container]
            if not await self._started(uid, name):
                position = Position(container=position.container + 1, seq=position.seq)
                continue
            position, revision = await self._ship_container(uid, name, position, revision)
            position = Position(container=position.container + 1, seq=position.seq)
        return True

    async def _started(self, uid: str, name: str) -> bool:
        """Wait until the container has run or is running (logs exist); False if it never will."""
        while True:
            state = container_state(self.pods[uid], name)
            if state in ("running", "terminated"):
                return True
            if state == "never":
                return False
            await self._pod_change(uid)

    async def _pod_change(self, uid: str) -> None:
        """Until the pod object changes (at most a few seconds: a missed wake-up only costs a re-check)."""
        event = self.changed.setdefault(uid, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=5.0)
        event.clear()
        if uid not in self.pods:
            raise NotFound(f"pod {uid} was deleted")

    # ---------------------------------------------------------------- one container

    async def _ship_container(
        self, uid: str, name: str, position: Position, revision: int
    ) -> tuple[Position, int]:
        """Ship from ``position`` until the container has terminated and its log is drained."""
        while True:
            finished = container_state(self.pods[uid], name) == "terminated"
            queue: asyncio.Queue[Any] = asyncio.Queue()
            reader = asyncio.create_task(self._read(uid, name, position, queue))
            try:
                position, revision = await self._ship_queue(uid, position, revision, queue)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            if reader.done() and not reader.cancelled() and (exc := reader.exception()) is not None:
                raise exc
            if finished:  # the stream was opened after the container ended: it held everything
                return position, revision
            await self._pod_change(uid)

    async def _read(self, uid: str, name: str, position: Position, queue: asyncio.Queue[Any]) -> None:
        pod = self.pods[uid]
        meta = pod["metadata"]
        keep = Filter(position)
        try:
            async for raw in self.api.log_lines(
                meta.get("namespace", ""), meta["name"], container=name, since_time=since_param(position.since)
            ):
                ts, text = split_line(raw)
                if keep.fresh(ts):
                    await queue.put((ts, text))
        finally:
            await queue.put(_END)

    async def _ship_queue(
        self, uid: str, position: Position, revision: int, queue: asyncio.Queue[Any]
    ) -> tuple[Position, int]:
        ended = False
        while not ended:
            item = await queue.get()
            if item is _END:
                return position, revision
            batch: list[tuple[str, str]] = [item]
            size = len(item[1]) + 1
            want = position.pending  # a chunk that may already be stored is rebuilt line for line
            while (want == 0 and size < MAX_CHUNK_BYTES) or len(batch) < want:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=None if want else self.flush_s)
                except TimeoutError:
                    break
                if item is _END:
                    ended = True
                    break
                batch.append(item)
                size += len(item[1]) + 1
            position, revision = await self._publish(uid, position, revision, batch)
        return position, revision

    async def _publish(
        self, uid: str, position: Position, revision: int, batch: list[tuple[str, str]]
    ) -> tuple[Position, int]:
        pod = self.pods[uid]
        ref = run_of(pod)
        assert ref is not None  # only tau pods are followed
        workspace, run_id, attempt = ref
        name = str(pod["metadata"]["name"])
        key = position_key(uid)
        if position.pending != len(batch):
            position = Position(container=position.container, since=position.since, at_since=position.at_since,
                                seq=position.seq, pending=len(batch))
            revision = await kv.save(self.bus, BUCKET, key, position, revision=revision)
        chunk = LogChunk(run_id=run_id, attempt=attempt, pod=name, seq=position.seq, lines=[t for _, t in batch])
        await self.bus.publish(
            log_subject(workspace, run_id, attempt), chunk, event_type="chunk", ce_subject=run_id,
            msg_id=f"{name}.{position.seq}", workspace=workspace, attempt=attempt, family="log",
            traceparent=traceparent_of(pod),
        )
        self.published += 1
        moved = position.advanced([ts for ts, _ in batch])
        return moved, await kv.save(self.bus, BUCKET, key, moved, revision=revision)
