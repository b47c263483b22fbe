"""Process runner for a service: logging, tracing, uvloop, connect, run its loops, drain on SIGTERM.

It sits above the bus adapter and the run record: every run event a service emits names the run's verified
submitter, read from the run record (``runrecord.VerifiedUsers``).

A service module provides ``async def start(bus) -> list[Awaitable]`` (its consumer loops and timers). On
SIGTERM/SIGINT the loops stop fetching, in-flight handlers finish and acks are flushed by ``drain``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from taugrid import settings
from taugrid.bus import metrics, tracing
from taugrid.bus.connection import Bus, connect
from taugrid.bus.consumer import STUCK_S, ConsumerLoop, Handler, report_stuck
from taugrid.core.errors import TemporaryError
from taugrid.runrecord import VerifiedUsers
from taugrid.settings import Settings, SettingsError

log = logging.getLogger("taugrid.service")


class Service:
    """What a service's ``start`` uses to declare its work."""

    def __init__(self, bus: Bus, given: Settings | None = None) -> None:
        """``given``: the process's settings, read once by ``main`` (default: ``settings.current()``); a
        service's ``start`` hands what it needs from them to what it builds."""
        self.bus = bus
        self.settings = given if given is not None else settings.current()
        self.loops: list[ConsumerLoop] = []
        self.tasks: list[Coroutine[Any, Any, None]] = []
        self.stopping = asyncio.Event()
        self.recycling = ""  # why the process starts itself afresh once drained (``recycle``), or ""

    def consume(self, durable: str, handler: Handler, *, batch: int = 32, ordered: bool = True) -> ConsumerLoop:
        """Bind ``durable`` with ``handler``; a stage with a high priority lane (``topology.LANE_DURABLES``)
        binds the lane's durable too, with the same handler and the same per-run order (shared ``tails``).
        ``ordered=False``: the handler keeps each run's order itself (``ConsumerLoop``)."""
        from taugrid.bus.topology import CONSUMERS, LANE_DURABLES

        loop = ConsumerLoop(self.bus, stream=CONSUMERS[durable].stream, durable=durable, handler=handler,
                            batch=batch, ordered=ordered)
        self.loops.append(loop)
        lane = LANE_DURABLES.get(durable)
        if lane is not None:
            high = ConsumerLoop(self.bus, stream=CONSUMERS[lane].stream, durable=lane, handler=handler,
                                batch=batch, tails=loop.tails, ordered=ordered)
            loop.yield_to(high)  # the default lane fetches only while the high lane has no backlog
            self.loops.append(high)
        return loop

    def every(self, seconds: float, fn: Callable[[], Awaitable[None]]) -> None:
        async def timer() -> None:
            name = getattr(fn, "__name__", str(fn))
            while not self.stopping.is_set():
                stuck = asyncio.get_running_loop().call_later(STUCK_S, report_stuck, f"timer {name}",
                                                              asyncio.current_task())
                try:
                    await fn()
                except Exception:
                    log.exception("timer %s failed", name)
                finally:
                    stuck.cancel()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), timeout=seconds)

        self.tasks.append(timer())

    def background(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(coro)

    def stop(self) -> None:
        self.stopping.set()
        for loop in self.loops:
            loop.stopping.set()

    def terminate(self) -> None:
        """SIGTERM/SIGINT: stop for good, even while draining to be recycled (``tau down`` waits for the exit)."""
        if self.recycling:
            log.info("not recycling after all: told to stop")
            self.recycling = ""
        self.stop()

    def recycle(self, why: str) -> None:
        """Stop as on SIGTERM (in-flight handlers finish, acks flushed, the bus closed), then ``main`` starts the
        service afresh in this process (``os.execv``: the same pid, arguments and environment), as uWSGI's
        ``reload-on-rss`` and Celery's ``max-memory-per-child`` recycle a worker: for what an allocator keeps
        after a peak and no ``free`` can give back (Python's arenas, pinned by a few objects that outlive it).
        Only for a service that picks its state up again at start, as every service here does after a crash."""
        if not self.recycling and not self.stopping.is_set():  # (stopping already: for good)
            log.warning("recycling: %s", why)
            self.recycling = why
            self.stop()


StartFn = Callable[[Service], Awaitable[None]]


async def run(name: str, start: StartFn, *, url: str | None = None, given: Settings | None = None) -> str:
    """Run the service until it is stopped; why it asked to be started afresh (``Service.recycle``), or ""."""
    tracing.setup(name)
    given = given if given is not None else settings.current()
    # Nothing would read what a service records without /metrics: it then never imports prometheus_client.
    metrics.record(given.metrics.port is not None)
    bus = None
    while bus is None:
        try:
            bus = await connect(url or given.bus.url, name=name)
        except TemporaryError as exc:
            log.warning("%s; retrying", exc)
            await asyncio.sleep(1.0)
    bus.user_lookup = VerifiedUsers(bus)  # every run event this service emits names the run's submitter
    svc = Service(bus, given)
    await start(svc)
    if metrics.serve(given.metrics) is not None:
        svc.every(5.0, lambda: _consumer_gauges(bus, svc.loops))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, svc.terminate)
    log.info("%s started (pid %s) with %d consumer(s)", name, os.getpid(), len(svc.loops))
    freeze_started()
    say_ready(given.process.ready_file)
    tasks = [asyncio.create_task(lp.run()) for lp in svc.loops] + [asyncio.create_task(t) for t in svc.tasks]
    stop_wait = asyncio.create_task(svc.stopping.wait())
    done, _ = await asyncio.wait([*tasks, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    for t in done:
        if t is not stop_wait and t.exception() is not None:
            log.error("%s: task died: %r", name, t.exception())
            svc.stop()
    svc.stop()
    if tasks:  # (a service may declare none)
        await asyncio.wait(tasks, timeout=10)
    await bus.close()
    log.info("%s drained and stopped", name)
    if any(t.done() and not t.cancelled() and t.exception() for t in tasks):
        sys.exit(1)
    return svc.recycling


def freeze_started() -> None:
    """What a service's start imported and built stays for its life: its cyclic garbage collected once, then the
    rest kept out of the cyclic collector's later passes (``gc.freeze``; objects still go when their last
    reference does, but a reference cycle among them, e.g. state built at start and replaced later, is never
    freed). Issue 30, idle p99: a full pass over a started service's objects, which the allocations of its
    first events trigger, took 40-120 ms of a run's path at each stage (up to 470 ms under load); traced over the
    first 20 idle runs of fresh stacks, the services' collections of generations 1 and 2 took 200.6 / 253.2 ms in
    all, 4.8 / 2.0 ms with this."""
    gc.collect()
    gc.freeze()


READY_FILE_ENV = "TAU_READY_FILE"  # as taugrid.stack.scaling names it (the bus layer does not import the stack)


def say_ready(path: Path | None) -> None:
    """Write this process's pid to ``$TAU_READY_FILE`` (set by the embedded stack's supervisor for each replica)
    once its handlers are set up, just before its loops bind their durables (which the bootstrap made, so what is
    published meanwhile waits in them): `tau up` waits for it, whatever the log level (at
    ``TAU_LOG_LEVEL=WARNING`` the "started" log line it read before never came, and `tau up` waited out its whole
    timeout, then said the services were still starting)."""
    if path is not None:
        ready = path
        ready.parent.mkdir(parents=True, exist_ok=True)
        tmp = ready.with_name(f"{ready.name}.{os.getpid()}.tmp")
        tmp.write_text(str(os.getpid()))
        tmp.replace(ready)


async def _consumer_gauges(bus: Bus, loops: list[ConsumerLoop]) -> None:
    """Each durable's pending and ack-pending counts, as the server reports them, for the metrics scrape."""
    for loop in loops:
        try:
            info = await bus.js.consumer_info(loop.stream, loop.durable)
        except Exception as exc:  # noqa: BLE001 - a missed sample only leaves the gauge at its last value
            log.debug("consumer info for %s: %r", loop.durable, exc)
            continue
        metrics.PENDING.labels(loop.durable).set(info.num_pending or 0)
        metrics.ACK_PENDING.labels(loop.durable).set(info.num_ack_pending or 0)


def main(name: str, start: StartFn) -> None:
    """Entry point for ``python -m taugrid_services.<name>``: the one place a service reads its settings."""
    try:
        given = settings.current()
    except SettingsError as exc:
        sys.exit(f"{name}: {exc}")
    logging.basicConfig(
        level=given.process.log_level,
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # uvloop is optional on platforms without it
        pass
    if asyncio.run(run(name, start, given=given)):  # recycled: this program again, in this process
        for handler in logging.getLogger().handlers:  # what is buffered would be lost with this image
            handler.flush()
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
