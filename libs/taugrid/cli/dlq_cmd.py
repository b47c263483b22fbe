"""``tau dlq``: the messages the services gave up on, and replaying them once the cause is fixed."""

from __future__ import annotations

import time
from pathlib import Path

import click

from taugrid import settings
from taugrid.cli.common import connected, emit_json, output_option, run_async
from taugrid.cli.views import table


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


@click.group(help="Dead letters: events a service refused or kept failing on (platform admins).")
def dlq() -> None:
    pass


@dlq.command("list", help="List the dead letters held, oldest first, with the reason each was given up on.")
@click.option("--durable", help="Only this consumer's (e.g. renderer, policy).")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True, help="The newest N.")
@output_option
@run_async
async def list_letters(durable: str | None, limit: int, output: str) -> None:
    import msgspec

    from taugrid.bus import dlq as dead

    async with connected() as client:
        letters = await dead.dead_letters(client.bus, durable=durable, limit=limit)
    if output == "json":
        emit_json([msgspec.to_builtins(x) for x in letters])
        return
    if not letters:
        click.echo("no dead letters" + (f" for {durable}" if durable else ""))
        return
    now = time.time()
    rows = [[str(x.seq), _age(now - x.time), x.durable, x.kind, x.subject or f"{x.stream} #{x.stream_seq} (gone)",
             x.error] for x in letters]
    click.echo(table(rows, ["seq", "age", "consumer", "kind", "subject", "reason"]))


def _bootstrap_creds() -> Path | None:
    """The embedded stack's bootstrap identity, when this person started the stack the CLI is talking to."""
    from taugrid.client import locate

    if settings.current().bus.creds is not None or locate.stack().get("nats_url") != locate.bus_url():
        return None
    path = locate.data_dir() / "creds" / "bootstrap.nk"
    return path if path.is_file() else None


@dlq.command("replay", help="Republish dead letters' original events (by SEQ from `tau dlq list`) to every "
                            "consumer of their subject, then drop them from the DLQ. Needs the bootstrap identity: "
                            "the embedded stack's own, or TAU_NATS_CREDS / --creds on a shared bus.")
@click.argument("seqs", nargs=-1, type=int, required=True)
@click.option("--creds", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Credentials of the bootstrap identity (default: the embedded stack's, when it is yours).")
@output_option
@run_async
async def replay(seqs: tuple[int, ...], creds: Path | None, output: str) -> None:
    import msgspec

    from taugrid.bus import dlq as dead
    from taugrid.client import open_client

    client = await open_client(creds=creds or _bootstrap_creds())
    try:
        done = await dead.replay(client.bus, seqs)
    finally:
        await client.close()
    if output == "json":
        emit_json([msgspec.to_builtins(x) for x in done])
        return
    for x in done:
        click.echo(f"replayed #{x.seq}: {x.subject} ({x.stream} #{x.stream_seq}), given up on by {x.durable}")
