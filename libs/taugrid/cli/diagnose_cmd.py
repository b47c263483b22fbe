"""``tau diagnose RUN``: why a run ended as it did (exit code, signal, OOM, GPU or node fault, preemption,
deadline, silence), its last lines, its node's health now, and the next step to take."""

from __future__ import annotations

import dataclasses

import click

from taugrid.cli.common import connected, emit_json, output_option, run_async

LAST_LINES = 15


@click.command(help="Why a run failed (or where it stands): exit code, signal, OOM, GPU or node fault, preemption, "
                    "deadline, its last output lines and its node's health, with the next step to take.")
@click.argument("run_id")
@click.option("--lines", type=click.IntRange(min=0), default=LAST_LINES, show_default=True,
              help="Last output lines to show (of the last attempt).")
@output_option
@run_async
async def diagnose(run_id: str, lines: int, output: str) -> None:
    from taugrid.bus import kv
    from taugrid.core.contracts import AdmissionPreempted, HealthDegraded, RecoveryGaveUp, Rejected
    from taugrid.core.diagnosis import RunFacts
    from taugrid.core.diagnosis import diagnose as decide
    from taugrid.core.ids import token
    from taugrid.health.wire import NodeState

    async with connected() as client:
        record = await client.status(run_id)
        rejected, preempted, degraded, gave_up = [], [], [], None
        async for ev in client.events(run_id=run_id):
            if ev.type in ("submit.rejected", "policy.rejected"):
                rejected += ev.payload(Rejected).reasons
            elif ev.type == "admission.preempted":
                p = ev.payload(AdmissionPreempted)
                preempted.append(p.preemptor or p.reason)
            elif ev.type == "health.degraded":
                d = ev.payload(HealthDegraded)
                degraded.append((d.node, d.condition, d.message))
            elif ev.type == "recovery.gave_up":
                gave_up = ev.payload(RecoveryGaveUp)
        tail: list[str] = []
        if lines:
            async for chunk in client.logs(run_id):
                if chunk.attempt == record.attempt:
                    tail = (tail + chunk.lines)[-lines:]
        verdict = ""
        if record.node:
            state, _ = await kv.load(client.bus, "node_state", f"node.{token(record.node)}", NodeState)
            verdict = state.verdict if state else ""
    found = decide(record, RunFacts(rejected=rejected, preempted_by=preempted, degraded=degraded, gave_up=gave_up,
                                    last_lines=tail, node_verdict=verdict))
    if output == "json":
        emit_json(dataclasses.asdict(found))
        return
    click.echo(f"{found.run_id}: {found.state} — {found.cause}")
    for name, value in found.facts.items():
        click.echo(f"  {name + ':':<15}{value}")
    if found.last_lines:
        click.echo(f"last {len(found.last_lines)} lines of attempt {record.attempt}:")
        for line in found.last_lines:
            click.echo(f"  | {line}")
    click.echo(f"next: {found.next_step}")
