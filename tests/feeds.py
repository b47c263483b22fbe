"""What a stream sourcing RUNS through its feeds (``topology.FEEDS``) is made of, as the server reports it."""

from __future__ import annotations

from taugrid.bus import Bus
from taugrid.bus.topology import AUDIT_FILTERS, FEEDS


async def fed_by(bus: Bus, stream: str) -> list[tuple[str, str, str, list[tuple[str, str]], list[str]]]:
    """``stream``'s sources: (stream sourced, its feed, the feed's delivery subject, the source's subject
    transforms, the feed's filters on RUNS)."""
    out = []
    for src in (await bus.js.stream_info(stream)).config.sources or []:
        assert src.consumer is not None, f"{stream} sources {src.name} without a feed"
        feed = (await bus.js.consumer_info(src.name, src.consumer.name)).config
        out.append((src.name, src.consumer.name, src.consumer.deliver_subject,
                    [(t.src, t.dest) for t in src.subject_transforms or []],
                    feed.filter_subjects or [feed.filter_subject]))
    return out


# AUDIT's feeds: its kept kinds of a run event (five tokens) and of a laned one (six), one subject a run
AUDIT_FEEDS = [
    ("RUNS", "audit", "feed.audit", [("run.*.*.*.*", "a.$1.$2")], [f for f in AUDIT_FILTERS if f.count(".") == 4]),
    ("RUNS", "audit-high", "feed.audit-high", [("run.*.*.*.*.*", "a.$1.$2")], ["run.*.*.submit.requested.high"]),
]
# HISTORY's feeds: every kind of run event AUDIT does not keep, of five tokens and of six (laned), one subject a run
HISTORY_FEEDS = [
    ("RUNS", "history", "feed.history", [("run.*.*.*.*", "h.$1.$2")], list(FEEDS[0].filters)),
    ("RUNS", "history-high", "feed.history-high", [("run.*.*.*.*.*", "h.$1.$2")],
     ["run.*.*.policy.approved.high", "run.*.*.submit.accepted.high"]),
]
