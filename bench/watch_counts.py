"""What one run costs the watch path (issue 11): a burst of N simulated runs on a fresh embedded stack, then, per
run, the Kubernetes watch events the local cluster published (by kind and type), how many of them imply no run
event at all (``translate`` + ``progress`` replayed over the stored K8S stream), the run events the admission
watcher emitted (by type), the KV writes of the ``bridge`` and ``local_cluster`` buckets, the K8S deliveries to
the admission watcher's durables, and the CPU per run of the admission watcher and the local cluster.
A diagnostic: it asserts nothing and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pipeline import burst_diagnostic, cpu_seconds, ended_burst, warmed_stack  # bench/ is on sys.path

from taugrid.bus import replay
from taugrid.core.contracts import WatchEvent
from taugrid.kube.progress import progress
from taugrid.kube.translate import RunRef, remember_owner, translate

WATCHER_TYPES = ("admission.", "exec.")  # the run events the admission watcher emits


async def stream_last(js: Any, stream: str) -> int:
    try:
        return int((await js.stream_info(stream)).state.last_seq or 0)
    except Exception:  # noqa: BLE001 - a bucket not created yet holds nothing
        return 0


async def deliveries(js: Any, stream: str, durable: str) -> int:
    try:
        return int((await js.consumer_info(stream, durable)).delivered.consumer_seq or 0)
    except Exception:  # noqa: BLE001 - a durable not created yet delivered nothing
        return 0


@contextlib.asynccontextmanager
async def holding(js: Any, stream: str, subjects: str, durable: str) -> AsyncIterator[None]:
    """K8S and BACKEND keep a message only until the durables whose filter matches it acked it (interest
    retention, issue 27): a durable that never acks, made before the runs, holds every new one for a replay
    afterwards; deleting it lets them go."""
    await js.add_consumer(stream, ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
                                                 deliver_policy=DeliverPolicy.NEW, filter_subject=subjects))
    try:
        yield
    finally:
        await js.delete_consumer(stream, durable)


def holding_k8s(js: Any, durable: str = "bench-hold-k8s") -> contextlib.AbstractAsyncContextManager[None]:
    """The watch changes K8S would drop once the admission watcher acked them, held (``holding``)."""
    return holding(js, "K8S", "k8s.>", durable)


def holding_backend(js: Any, durable: str = "bench-hold-backend") -> contextlib.AbstractAsyncContextManager[None]:
    """The requests BACKEND would drop once their reader acked them, held (``holding``)."""
    return holding(js, "BACKEND", "backend.>", durable)


async def counters(js: Any) -> dict[str, int]:
    return {"k8s": await stream_last(js, "K8S"), "runs": await stream_last(js, "RUNS"),
            "kv_bridge": await stream_last(js, "KV_bridge"), "kv_local": await stream_last(js, "KV_local_cluster"),
            "aw_deliveries": await deliveries(js, "K8S", "admission-watcher")
            + await deliveries(js, "K8S", "admission-watcher-high")}


async def measure(url: str, data: Path, runs: int) -> None:
    client, admin, watch = await warmed_stack(url, data)
    js = admin.bus.js
    async with holding_k8s(js):  # the burst's watch changes, kept for the replay below
        before, cpu_before = await counters(js), cpu_seconds(data)
        first_k8s = before["k8s"] + 1
        burst = await ended_burst(client, watch, runs)
        await asyncio.sleep(4.0)  # the last watch events, evidence and projections settle
        after, cpu_after = await counters(js), cpu_seconds(data)
        published: Counter[str] = Counter()
        silent: Counter[str] = Counter()
        outputs: Counter[str] = Counter()
        owners: dict[str, RunRef] = {}
        async for batch in replay.batches(admin.bus, "k8s.>", stream="K8S"):
            for ev in batch:
                if ev.seq < first_k8s:
                    continue
                watch_ev = ev.payload(WatchEvent)
                what = f"{watch_ev.object.get('kind', '?')} {watch_ev.type}"
                published[what] += 1
                remember_owner(watch_ev, owners)
                outs = [*progress(watch_ev, owners), *translate(watch_ev, owners)]
                if not outs:
                    silent[what] += 1
                outputs.update(o.event_type for o in outs)
    emitted: Counter[str] = Counter()
    async for batch in replay.batches(admin.bus, "run.>", stream="RUNS"):
        for ev in batch:
            if ev.subject in burst and ev.type.startswith(WATCHER_TYPES):
                emitted[ev.type] += 1
    n = max(1, len(burst))
    print(f"\nwatch path per run over a burst of {len(burst)} simulated runs "
          f"({sum(1 for r in burst if r in watch.ended)} ended)")
    print(f"  K8S watch events published: {sum(published.values()) / n:.2f}; of which imply no run event: "
          f"{sum(silent.values()) / n:.2f}")
    for what, count in sorted(published.items()):
        print(f"    {what:<22}{count / n:6.2f}   no run event: {silent[what] / n:5.2f}")
    print(f"  translated outputs (each one was a run_state read before its emit): {sum(outputs.values()) / n:.2f}")
    for what, count in sorted(outputs.items()):
        print(f"    {what:<22}{count / n:6.2f}")
    print(f"  run events stored from the admission watcher: {sum(emitted.values()) / n:.2f}")
    for what, count in sorted(emitted.items()):
        print(f"    {what:<22}{count / n:6.2f}")
    for key, label in (("aw_deliveries", "K8S deliveries to the admission watcher"),
                       ("kv_bridge", "KV writes, bucket bridge"), ("kv_local", "KV writes, bucket local_cluster"),
                       ("runs", "RUNS messages stored (all services)")):
        print(f"  {label:<44}{(after[key] - before[key]) / n:6.2f}")
    for name in sorted(cpu_after):
        if name.startswith(("admission_watcher", "local_cluster")) and name in cpu_before:
            print(f"  CPU per run, {name:<31}{1000 * (cpu_after[name] - cpu_before[name]) / n:6.2f} ms")
    await client.close()
    await admin.close()


def main() -> None:
    burst_diagnostic(__doc__, "tau-bench-watch-", 200, measure)

if __name__ == "__main__":
    main()
