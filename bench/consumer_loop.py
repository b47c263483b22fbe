"""The consumer loop's own cost per message: CPU a service spends to fetch, check, hand over and ack one event.

Starts an authenticated nats-server (``tests/secure_nats``: service keys recorded, so every event's signature is
checked as in a stack), stores N ``policy.approved`` events signed by the policy service, then lets the renderer's
durable consume them with a handler that does nothing, and prints this process's CPU per message for the
consuming alone (the publishing is done before and not counted). ``--profile FILE`` writes a cProfile of the
consuming. A diagnostic of the common path every service pays (issue 30); it asserts nothing."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.secure_nats

from taugrid.bus import tracing  # noqa: E402
from taugrid.bus.consumer import ConsumerLoop  # noqa: E402
from taugrid.bus.envelope import Event  # noqa: E402
from tests.secure_nats import started  # noqa: E402


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3, help="consume this many bursts of N, print each")
    ap.add_argument("--profile", default="")
    args = ap.parse_args()
    tracing.setup("bench")  # as every service does: no exporter, spans only carried
    with tempfile.TemporaryDirectory() as tmp:
        async with started(Path(tmp)) as server:
            policy = await server.connect("policy")
            renderer = await server.connect("renderer")
            try:
                for burst in range(args.repeat):
                    await asyncio.gather(*(policy.publish(
                        f"run.bench.r{burst}-{i}.policy.approved", b'{"x":1}', event_type="policy.approved",
                        ce_subject=f"r{burst}-{i}", msg_id=f"r{burst}-{i}.1.policy.approved", workspace="bench",
                    ) for i in range(args.events)))
                    seen: list[Event] = []
                    done = asyncio.Event()

                    async def handler(ev: Event, seen: list[Event] = seen, done: asyncio.Event = done) -> None:
                        seen.append(ev)
                        if len(seen) == args.events:
                            done.set()

                    loop = ConsumerLoop(renderer, stream="RUNS", durable="renderer", handler=handler)
                    profile = cProfile.Profile(time.process_time) if args.profile else None
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    if profile:
                        profile.enable()
                    task = asyncio.create_task(loop.run())
                    await asyncio.wait_for(done.wait(), timeout=300)
                    loop.stopping.set()
                    await task
                    if profile:
                        profile.disable()
                        profile.dump_stats(args.profile)
                    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                    print(f"{len(seen)} events consumed: {1e6 * cpu / len(seen):.0f} us CPU each "
                          f"({wall:.2f} s wall)")
            finally:
                await policy.close()
                await renderer.close()


if __name__ == "__main__":
    asyncio.run(main())
