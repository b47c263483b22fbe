"""A researcher's run as its stages would have published it, sealed as the evidence service seals it, for the
security tests that look at what a bundle holds (real nats-server; the publishers stand in for the services)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import msgspec

from taugrid.bus import Bus, identity
from taugrid.bus.envelope import Event, from_message
from taugrid.bus.replay import replay
from taugrid.core import contracts as c
from taugrid.core.events import log_subject
from taugrid.evidence import store
from tests.owners import acting_as, emit_as_owner


def new_run() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"sec{tag}", f"r-{tag}"


async def publish_run(bus: Bus, ws: str, run: str, out: Path, *, config_text: str, config: dict[str, Any],
                      env: dict[str, str] | None = None, log_lines: list[str] | None = None) -> None:
    """A signed submission through ``exec.running``, with the run's output on LOGS."""
    bus.seed = identity.new_user_seed()
    resolved = c.ResolvedRun(run_id=run, submission_id="sub-1", workspace=ws, namespace=f"ns-{ws}", name="train",
                             entrypoint="train.py", image="python:3.12", env=env or {},
                             output_dir=str(out / "output"), checkpoint_dir=str(out / "ckpt"), platform_revision=0)
    steps: list[tuple[str, msgspec.Struct]] = [
        ("submit.requested", c.SubmitRequested(submission_id="sub-1", config_text=config_text, workspace=ws,
                                               user="eve")),
        ("submit.accepted", c.SubmitAccepted(submission_id="sub-1", config=config, config_hash="cfg",
                                             config_text=config_text, user="eve",
                                             signer=identity.public_key(bus.seed))),
        ("policy.approved", c.PolicyApproved(run=resolved)),
        ("exec.running", c.ExecRunning(node="box", pod=f"{run}-a1-0", pid=42)),
    ]
    for kind, payload in steps:
        await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type=kind, payload=payload)
    if log_lines:
        chunk = c.LogChunk(run_id=run, attempt=1, pod=f"{run}-a1-0", seq=0, lines=log_lines)
        await bus.publish(log_subject(ws, run, 1), chunk, event_type="log.chunk", ce_subject=run,
                          msg_id=f"{run}.1.log.0", workspace=ws, family="log")


async def finish_and_seal(bus: Bus, ws: str, run: str) -> dict[str, Any]:
    """``exec.succeeded``, then the seal and its announcement; the stored bundle's JSON."""
    await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="exec.succeeded",
                        payload=c.ExecFinished(exit_code=0))
    terminal = await stored_event(bus, f"run.{ws}.{run}.exec.succeeded")
    sealed = await store.seal(bus, terminal)
    with acting_as(bus, "evidence"):  # evidence.sealed is the evidence service's to publish
        assert await store.announce(bus, sealed)
    got = await store.read_bundle(bus, run)
    assert got is not None
    return got[1]


async def stored_event(bus: Bus, subject: str) -> Event:
    """The event as RUNS holds it, as the evidence's durable would deliver it (RUNS keeps a terminal event until
    that durable acked it, and no evidence service runs here)."""
    [m] = await replay(bus, stream="RUNS", subject=subject)
    return from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream)
