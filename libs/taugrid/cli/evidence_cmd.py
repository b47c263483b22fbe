"""``tau evidence RUN`` (the sealed record) and ``tau verify RUN`` (re-check it against the audit stream)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from taugrid.cli.common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    connected,
    data_dir,
    emit_json,
    fail,
    output_option,
    run_async,
)
from taugrid.evidence.store import bundle_entries, read_bundle
from taugrid.evidence.verify import as_dict, verify_run


@click.command(
    help="Show a run's sealed evidence bundle (config, resolved spec, manifests, logs, exit, history)."
)
@click.argument("run_id")
@click.option(
    "--save",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the exact sealed bytes to this file.",
)
@output_option
@run_async
async def evidence(run_id: str, save: Path | None, output: str) -> None:
    async with connected() as client:
        record = await client.status(run_id)  # an unknown run is "not found", not "not sealed yet"
        got = await read_bundle(client.bus, run_id, workspace=record.workspace)  # not a namesake elsewhere
    if got is None:
        fail(f"run {run_id} is {record.state}: its evidence is sealed when it finishes", EXIT_NOT_FOUND)
        return
    raw, bundle = got
    if save:
        save.write_bytes(raw)
    if output == "json":
        emit_json(bundle)
        return
    term = bundle.get("terminal", {})
    click.echo(f"run {run_id}: {term.get('state')} (attempt {term.get('attempt')})")
    config = bundle.get("config", {})
    click.echo(f"  config      {config.get('path')}  hash {config.get('config_hash')}")
    click.echo(f"  source      {bundle.get('source', {}).get('digest')}")
    click.echo(f"  platform    revision {bundle.get('platform', {}).get('revision')}")
    acc = bundle.get("accounting")
    if isinstance(acc, dict):
        click.echo(f"  accounting  queued {acc.get('queued_s', 0):.1f}s, ran {acc.get('running_s', 0):.1f}s, "
                   f"{acc.get('gpu_seconds', 0):.1f} GPU-s, est. cost {acc.get('cost', 0):.4f}")
    for a in bundle.get("attempts", []):
        exit_ = a.get("exit") or {}
        click.echo(
            f"  attempt {a.get('attempt')}: {exit_.get('event', '-')} exit={exit_.get('exit_code')} "
            f"reason={exit_.get('reason', '')} log lines={a.get('logs', {}).get('lines', 0)}"
        )
    click.echo(f"  events      {len(bundle.get('events', []))}, ledger head {_ledger_head(bundle)}")


def _ledger_head(bundle: dict[str, Any]) -> str | None:
    """The bundle's chain head: written (listed entries), or its event records' chain's (issue 27)."""
    try:
        entries = bundle_entries(bundle)
    except ValueError:
        return None
    return entries[-1].hash if entries else None


@click.command(help="Re-verify a run's evidence: bundle digest, hash chain, every event against the bundle and, "
               "while HISTORY holds the run, the events RUNS stored as HISTORY keeps them, and its requests, end "
               "and seal against AUDIT. "
               "With --anchor, also against a signed anchor file kept outside the bus "
               "($TAU_DATA_DIR/anchors/ledger.jsonl locally), which detects a rewritten history; every anchor "
               "must be signed by the pinned anchor key (the one `tau up` pinned, or --anchor-key).")
@click.argument("run_id")
@click.option("--anchor", "anchor_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="anchor file (JSON lines) to check the run's ledger and AUDIT against")
@click.option("--anchor-key", default=None, metavar="KEY",
              help="public key the anchors must be signed by (default: the key `tau up` pinned for this stack; "
              "on Kubernetes the one `tau admin chart-credentials` printed)")
@output_option
@run_async
async def verify(run_id: str, anchor_path: Path | None, anchor_key: str | None, output: str) -> None:
    anchors = _read_anchors(anchor_path) if anchor_path else []
    trusted = _anchor_key(anchor_key) if anchor_path else ""
    if anchor_path:
        from taugrid.evidence import anchor

        forged = anchor.signed_by(anchors, trusted)
        if forged:  # refused before anything is compared: whoever signed it could have written anything
            fail(f"{anchor_path} is not signed by the pinned anchor key, so it proves nothing:\n"
                 + "\n".join(f"  - {p}" for p in forged), EXIT_FAILED)
    async with connected() as client:
        record = await client.status(run_id)  # an unknown run is "not found" (exit 3)
        report = await verify_run(client.bus, run_id, workspace=record.workspace)
        if anchor_path:
            from taugrid.evidence import anchor, store

            try:  # with its entries, read from the sealed bundle and checked against the seal on the bus
                ledger = await store.read_ledger(client.bus, record.workspace, run_id)
            except store.BundleModified:  # the report says why; the anchors still check the seal's head and digest
                ledger, _ = await store.load(client.bus, record.workspace, run_id)
            problems = await anchor.check(client.bus, anchors, run_id=run_id, workspace=record.workspace,
                                          ledger=ledger, trusted=trusted)
            report.problems += problems
            report.ok = report.ok and not problems
    if output == "json":
        emit_json(as_dict(report))
    else:
        click.echo(
            f"{run_id}: {'verified' if report.ok else 'NOT verified'} ({report.entries} entries, "
            f"digest {report.digest})"
        )
        if report.archive:
            click.echo(f"  bundle read from the evidence archive, {report.archive} (the bus keeps its digest)")
        if report.user or report.signer:
            click.echo(f"  submitted by {report.user or '(unverified)'}, signed by {report.signer or '(nobody)'}")
        acc = report.accounting
        if acc:
            click.echo(f"  accounting  queued {acc.get('queued_s', 0):.1f}s, ran {acc.get('running_s', 0):.1f}s, "
                       f"{acc.get('gpu_seconds', 0):.1f} GPU-s, est. cost {acc.get('cost', 0):.4f}")
        for p in report.problems:
            click.echo(f"  - {p}")
    if not report.ok:
        sys.exit(EXIT_FAILED)


def _anchor_key(given: str | None) -> str:
    """The key every anchor must be signed by: ``--anchor-key``, else the one ``tau up`` pinned for this stack."""
    from taugrid.core.identity import is_user_public_key
    from taugrid.stack import operator

    if given is not None:
        if not is_user_public_key(given.strip()):
            fail(f"--anchor-key {given!r} is not a public key (56 characters starting with U, as `tau up` or "
                 "`tau admin chart-credentials` printed it)", EXIT_USAGE)
        return given.strip()
    d = data_dir()
    pinned = operator.pinned_anchor_key(d)
    if pinned is None:
        fail(f"no anchor key is pinned for the stack in {d} (`tau up` pins it in "
             f"{operator.stack_dir(d) / operator.ANCHOR_KEY_FILE}): pass --anchor-key KEY, the key the anchors must "
             "be signed by", EXIT_USAGE)
        raise AssertionError  # fail() exits
    return pinned


def _read_anchors(path: Path) -> list[dict[str, object]]:
    from taugrid.evidence import anchor

    try:
        anchors = anchor.read(path)
    except (OSError, ValueError) as exc:
        fail(f"{path}: not an anchor file ({exc})", EXIT_USAGE)
    if not anchors:
        fail(f"{path}: holds no anchor", EXIT_USAGE)
    return anchors
