"""``tau events``: the stored history of run events (the audit trail), or a live feed, and ``tau events schema``.

Its own module, so a replay loads only what reading needs: the bus client's reading half, the views, no run-config
or platform models (pydantic) as ``cli/runs.py`` does for submitting (``tests/cli/test_cold_cli.py``). The stored
history is written a fetched batch at a time, each as one buffer of JSON Lines (``views.event_json_lines``).
"""

from __future__ import annotations

import datetime as dt
import gc
import sys

import click

from taugrid.cli.common import connected, output_option, run_async
from taugrid.cli.views import event_json_lines, event_line


def _parse_since(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[-1] in units and value[:-1].isdigit():
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=int(value[:-1]) * units[value[-1]])
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(
            "use a duration like 10m / 2h or an ISO time like 2026-11-29T10:00:00Z"
        ) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


@click.group(
    invoke_without_command=True,
    subcommand_metavar="[schema]",
    help="Replay run events from the stream (the audit history), optionally filtered. `tau events schema` "
    "prints the bus contract (AsyncAPI, JSON Schema) for clients in any language.",
)
@click.option("--run", "run_id", default=None, help="Only this run.")
@click.option("--since", default=None, help="Only events after this (10m, 2h, or an ISO time).")
@click.option(
    "--type", "types", multiple=True, help="Only these types, e.g. exec.failed (repeatable; prefix ok)."
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events.")
@output_option
@click.pass_context
def events(
    ctx: click.Context, run_id: str | None, since: str | None, types: tuple[str, ...], follow: bool, output: str
) -> None:
    if ctx.invoked_subcommand is None:
        _replay_events(run_id, since, types, follow, output)


@events.command("schema", help="Print the bus contract, generated from the code (no stack needed): the AsyncAPI "
                "3.0 document of subjects, streams, headers and signing (docs/asyncapi.yaml), or the JSON Schema "
                "of every event payload (docs/events.schema.json).")
@click.option("--format", "fmt", type=click.Choice(["asyncapi", "jsonschema"]), default="asyncapi",
              show_default=True, help="Which document.")
@click.option("--output", "-o", type=click.Choice(["yaml", "json"]), default=None,
              help="Serialisation [default: yaml for asyncapi, json for jsonschema].")
def events_schema(fmt: str, output: str | None) -> None:
    from taugrid.cli.asyncapi import asyncapi, dump, json_schema

    document = asyncapi() if fmt == "asyncapi" else json_schema()
    click.echo(dump(document, output or ("yaml" if fmt == "asyncapi" else "json")), nl=False)


@run_async
async def _replay_events(
    run_id: str | None, since: str | None, types: tuple[str, ...], follow: bool, output: str
) -> None:
    async with connected() as client:
        if run_id:
            await client.status(run_id)  # an unknown run is "not found" (exit 3), not an empty history
        if not follow:  # the stored history: a batch at a time, written in one piece
            # Reading makes no reference cycles, only short-lived objects by the hundred thousand, which the
            # collector would otherwise walk every 700 allocations (~15 % of this process's CPU): off meanwhile.
            gc.disable()
            stored = 0
            try:
                async for got in client.event_batches(run_id=run_id, since=_parse_since(since)):
                    stored += len(got)
                    wanted = [ev for ev in got if _wanted(ev.type, types)] if types else got
                    if output == "json":
                        sys.stdout.buffer.write(event_json_lines(wanted))
                        sys.stdout.buffer.flush()
                    elif wanted:
                        click.echo("\n".join(event_line(ev) for ev in wanted))
            finally:
                gc.enable()
            if run_id and not stored and not since:
                click.echo(_aged_out(run_id), err=True)
            return
        async for ev in client.events(run_id=run_id, since=_parse_since(since), follow=follow):
            if not _wanted(ev.type, types):
                continue
            if output == "json":  # as the stored history prints (an undecodable payload said so, not raised)
                sys.stdout.buffer.write(event_json_lines([ev]))
                sys.stdout.buffer.flush()
            else:
                click.echo(event_line(ev))


def _aged_out(run_id: str) -> str:
    """Where a known run's events are once HISTORY no longer holds them (its max age: ``retention.runs``)."""
    return (f"run {run_id}: HISTORY no longer holds its events (they are kept for retention.runs.max_age). Its sealed "
            f"evidence holds every one of them: `tau evidence {run_id}`; AUDIT keeps its requests, its end and its "
            f"seal for longer: `tau verify {run_id}` checks them")


def _wanted(event_type: str, types: tuple[str, ...]) -> bool:
    """``--type``: exact types or prefixes (``exec`` or ``exec.*`` is every exec event)."""
    return not types or any(
        event_type == t or event_type.startswith(t.rstrip("*").rstrip(".") + ".") for t in types)
