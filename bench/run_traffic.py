"""What one run costs the bus, message by message (issue 30 item 1): a burst of N simulated runs on a fresh embedded
stack (the one-queue platform of ``bench/pipeline.py``) with one wildcard subscription of the bootstrap identity
beside it, and, per run: every message published, by what it is (run events by type, watch changes by kind and
type, backend requests, KV writes by bucket, object chunks, JetStream API requests by verb, acks by durable, core
requests and replies), the deliveries to each durable (its consumer's counter and the deliveries seen on the wire),
and the messages each stream stored. The wildcard subscription makes the server copy every message once more to
the bench, so this bench counts and does not time; CPU per run is ``bench/cpu_per_run.py``'s. A diagnostic: it
asserts nothing and exits 0.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from pipeline import burst_diagnostic, ended_burst, warmed_stack  # bench/ is on sys.path


def kind_of(subject: str, reply: str) -> str:
    """A message's class, from its subject (and, for a delivery, the ack subject its reply names)."""
    t = subject.split(".")
    if reply.startswith("$JS.ACK."):  # a delivery to a pull consumer: $JS.ACK.<stream>.<durable>.…
        r = reply.split(".")
        return f"delivery {r[2]}/{r[3]}"
    if subject.startswith("$JS.ACK."):
        return f"ack {t[2]}/{t[3]}"
    if subject.startswith("$JS.API."):
        verb = t[2] if t[2] in ("INFO",) else ".".join(t[2:4])
        if verb == "CONSUMER.MSG":
            verb = "CONSUMER.MSG.NEXT"
        elif verb.startswith("DIRECT."):
            verb = f"DIRECT.GET {t[4] if len(t) > 4 else ''}"
        elif verb.startswith("STREAM."):
            verb = f"{verb} {t[4] if len(t) > 4 else ''}"
        return f"api {verb}"
    if subject.startswith("$KV."):
        return f"kv {t[1]}"
    if subject.startswith("$O."):
        return f"object {t[1]} {t[2]}"
    if t[0] == "run" and len(t) >= 5:
        return "run " + ".".join(t[3:])
    if t[0] == "k8s" and len(t) >= 6:
        return f"k8s {t[2]} {t[5]}" + (" high" if len(t) > 6 else "")
    if t[0] == "backend":
        return "backend " + ".".join(t[2:])
    if t[0] in ("_INBOX", "_tau") or subject.startswith("_INBOX"):
        return "reply (inbox)"
    if t[0] == "$JS" and len(t) > 1 and t[1] == "FC":
        return "flow control"
    if t[0] == "$JS":  # the server's advisories (one per API request while anyone listens: this bench), sourcing
        return "$JS " + ".".join(t[1:4])
    return t[0] + (" " + t[1] if len(t) > 1 and t[0] in ("log", "node") else "")


async def stored(js: Any) -> dict[str, int]:
    return {i.config.name: int(i.state.last_seq or 0) for i in await js.streams_info()}


async def delivered(js: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for info in await js.streams_info():
        for c in await js.consumers_info(info.config.name):
            if c.config.durable_name:
                out[f"{info.config.name}/{c.config.durable_name}"] = int(c.delivered.consumer_seq or 0)
    return out


async def measure(url: str, data: Path, runs: int) -> None:
    client, admin, watch = await warmed_stack(url, data)
    js, nc = admin.bus.js, admin.bus.nc
    seen: Counter[str] = Counter()
    by_sender: Counter[tuple[str, str]] = Counter()  # (reply inbox prefix, what) of requests, KV writes, publishes
    inbox_of: dict[str, set[str]] = {}  # reply inbox prefix → the durables whose acks it asked for (its process)
    counting = True

    async def on_any(msg: Any) -> None:
        if not counting:
            return
        what = kind_of(msg.subject, msg.reply or "")
        seen[what] += 1
        if (msg.reply or "").startswith("_INBOX."):
            prefix = ".".join(msg.reply.split(".")[:2])
            if what.startswith("ack "):
                inbox_of.setdefault(prefix, set()).add(what[4:])
            by_sender[prefix, what] += 1

    stored0, delivered0 = await stored(js), await delivered(js)  # before counting: the bench's own requests
    api0 = int((await js.account_info()).api.total)
    sub = await nc.subscribe(">", cb=on_any, pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    await nc.flush()
    burst = await ended_burst(client, watch, runs)
    await asyncio.sleep(6.0)  # the seals (the evidence runs niced) and the projections settle
    counting = False
    await sub.unsubscribe()
    api1 = int((await js.account_info()).api.total) - 1  # less this very request
    stored1, delivered1 = await stored(js), await delivered(js)
    n = max(1, len(burst))
    print(f"\nbus traffic per run over a burst of {len(burst)} simulated runs "
          f"({sum(1 for r in burst if r in watch.ended)} ended)")
    print(f"  JetStream API requests (account counter): {(api1 - api0) / n:.2f}")
    groups: dict[str, Counter[str]] = {}
    for what, count in seen.items():
        groups.setdefault(what.split(" ", 1)[0], Counter())[what] = count
    for group in sorted(groups, key=lambda g: -sum(groups[g].values())):
        total = sum(groups[group].values())
        print(f"  {group:<40}{total / n:8.2f}")
        for what, count in sorted(groups[group].items(), key=lambda kv: -kv[1]):
            print(f"      {what:<36}{count / n:8.2f}")
    print("  requests, KV writes and publishes by the process that asked (named by the durables it acks)")
    senders: dict[str, Counter[str]] = {}
    for (prefix, what), count in by_sender.items():
        if not what.startswith("ack "):
            who = ", ".join(sorted(inbox_of.get(prefix, {"?"})))
            senders.setdefault(who, Counter())[what] += count
    for who in sorted(senders, key=lambda w: -sum(senders[w].values())):
        print(f"    {who:<38}{sum(senders[who].values()) / n:8.2f}")
        for what, count in sorted(senders[who].items(), key=lambda kv: -kv[1]):
            if count / n >= 0.05:
                print(f"        {what:<34}{count / n:8.2f}")
    print("  stored per stream")
    for name in sorted(stored1):
        if stored1[name] - stored0.get(name, 0):
            print(f"      {name:<36}{(stored1[name] - stored0.get(name, 0)) / n:8.2f}")
    print("  deliveries per durable (consumer counters)")
    for name in sorted(delivered1):
        if delivered1[name] - delivered0.get(name, 0):
            print(f"      {name:<36}{(delivered1[name] - delivered0.get(name, 0)) / n:8.2f}")
    await client.close()
    await admin.close()


def main() -> None:
    burst_diagnostic(__doc__, "tau-bench-traffic-", 100, measure)

if __name__ == "__main__":
    main()
