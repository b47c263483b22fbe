"""The pod log endpoint of the emulated API server (``GET .../pods/<pod>/log``), as the kubelet serves it.

Lines are stored per (namespace, pod, container) with their RFC3339Nano timestamps. Honoured query
parameters: ``container``, ``timestamps`` (prefix ``<ts> ``), ``sinceTime`` (RFC3339; lines at or after it,
compared at full precision like the kubelet), ``follow`` (keep the stream open and send new lines until the
container is marked finished). ``drop()`` cuts every open log stream at the TCP level, as a failing
apiserver or node would.

``sources`` (set by the emulated cluster, tests/kube/cluster.py) serves the logs of pods a real kubelet runs:
called with (namespace, pod, container, params), it returns a function giving the lines (already honouring
``timestamps``/``sinceTime``/``follow``), or None for a pod or container it does not have.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

Key = tuple[str | None, str, str]
Source = Callable[[str | None, str, str, dict[str, str]], Callable[[], AsyncIterator[str]] | None]


def _instant(ts: str) -> tuple[int, int]:
    whole, _, rest = ts.rstrip("Z").partition(".")
    seconds = int(datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp())
    return seconds, int(rest.ljust(9, "0")[:9]) if rest else 0


class FakeLogs:
    def __init__(self) -> None:
        self.lines: dict[Key, list[tuple[str, str]]] = {}
        self.finished: set[Key] = set()
        self.requests: list[dict[str, str]] = []
        self._changed = asyncio.Event()
        self._drops = 0
        self.sources: Source | None = None

    def write(self, namespace: str | None, pod: str, container: str, ts: str, text: str) -> None:
        self.lines.setdefault((namespace, pod, container), []).append((ts, text))
        self._wake()

    def finish(self, namespace: str | None, pod: str, container: str) -> None:
        self.lines.setdefault((namespace, pod, container), [])
        self.finished.add((namespace, pod, container))
        self._wake()

    def drop(self) -> None:
        self._drops += 1
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def serve(self, namespace: str | None, pod: str, request: Any) -> Any:
        params = dict(request.params)
        self.requests.append({"pod": pod, **params})
        key = (namespace, pod, params.get("container", ""))
        lines = self.sources(namespace, pod, key[2], params) if self.sources is not None else None
        if lines is not None:
            return self._relay(lines, request)
        if key not in self.lines:
            return None  # the caller answers 404/400
        return self._stream(key, params, request)

    async def _stream(self, key: Key, params: dict[str, str], request: Any) -> AsyncIterator[bytes]:
        since = _instant(params["sinceTime"]) if params.get("sinceTime") else (0, 0)
        stamps, follow = params.get("timestamps") == "true", params.get("follow") == "true"
        drops = self._drops
        sent = 0
        yield b""  # headers now
        while True:
            changed = self._changed
            lines = self.lines[key]
            for ts, text in lines[sent:]:
                if _instant(ts) >= since:
                    yield ((ts + " ") if stamps else "").encode() + text.encode() + b"\n"
            sent = len(lines)
            if not follow or key in self.finished:
                return
            await changed.wait()
            if self._drops != drops:
                transport = request._raw_request.transport if request._raw_request else None
                if transport is not None:
                    transport.abort()
                return

    async def _relay(self, lines: Callable[[], AsyncIterator[str]], request: Any) -> AsyncIterator[bytes]:
        """A source's lines, cut at the TCP level by ``drop()`` like the stored ones."""
        drops = self._drops
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for line in lines():
                    await queue.put(line)
            finally:
                await queue.put(None)

        reader = asyncio.create_task(pump())
        try:
            yield b""  # headers now
            while True:
                changed = self._changed
                get, woken = asyncio.ensure_future(queue.get()), asyncio.ensure_future(changed.wait())
                await asyncio.wait([get, woken], return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if self._drops != drops:
                    get.cancel()
                    transport = request._raw_request.transport if request._raw_request else None
                    if transport is not None:
                        transport.abort()
                    return
                if not get.done():
                    get.cancel()
                    continue
                line = get.result()
                if line is None:
                    return
                yield line.encode() + b"\n"
        finally:
            reader.cancel()
