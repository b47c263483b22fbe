"""``--follow``: a run's console. Stage lines and the script's own output, interleaved as they arrive, with a
separator per attempt; then the phase tree, and for a failure the last lines of output, the reason and a hint.

Stage lines start with the elapsed time in brackets; the script's lines are printed as the script wrote them.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

import click

from taugrid.cli.common import EXIT_FAILED, EXIT_REJECTED, color, emit_json
from taugrid.cli.outputs_cmd import listing, summary_lines
from taugrid.cli.views import attempt_separator, elapsed, phase_tree, stage_line
from taugrid.client.progresslines import ProgressLines
from taugrid.core.contracts import LogChunk

TAIL_LINES = 10


async def follow_run(client: Any, run_id: str, output: str) -> None:
    """Print the run live until it is sealed; exit 0 only if it succeeded (5 if rejected, else 1)."""
    start = time.time()
    tails: dict[int, deque[str]] = {}
    attempt = 1
    progress = ProgressLines()
    async for item in client.console(run_id):
        if isinstance(item, LogChunk):
            tails.setdefault(item.attempt, deque(maxlen=TAIL_LINES)).extend(item.lines)
            for line in item.lines:
                if output == "json":
                    emit_json({"run_id": run_id, "attempt": item.attempt, "pod": item.pod, "line": line})
                else:
                    click.echo(line)
            continue
        if output == "json":
            emit_json(item.to_json())
            continue
        if item.type == "recovery.retrying" and item.attempt > attempt:
            attempt = item.attempt
            data = item.as_dict()
            delay = float(data.get("delay_s") or 0)
            backoff = f", backoff {delay:g}s" if delay > 0 else ""
            click.echo(attempt_separator(attempt, f"retry after {data.get('reason', '')}{backoff}"))
        line = stage_line(item)
        if progress.repeats(item, line):  # one exec.progress line per change
            continue
        click.echo(color(f"[{elapsed(start, None):>6}] ", "cyan") + line)
    record = await client.settled(run_id)
    if output != "json":
        tail = tails.get(record.attempt)
        if record.state == "failed" and tail:
            click.echo(f"last {len(tail)} line(s) of output (all of it: `tau logs {run_id}`):")
            for line in tail:
                click.echo(f"  {line}")
        click.echo(phase_tree(record))
        for line in summary_lines(await listing(client, record)):
            click.echo(line)
    if record.state != "succeeded":
        sys.exit(EXIT_REJECTED if record.state == "rejected" else EXIT_FAILED)
