"""``tau reproduce RUN``: run again exactly what a run's sealed evidence records — the same config text, the
same source snapshot (by digest), resolved against the same platform revision — refusing when any piece is
missing or does not verify."""

from __future__ import annotations

from typing import Any

import click

from taugrid.cli.common import EXIT_REJECTED, connected, emit_json, fail, output_option, run_async
from taugrid.cli.runs import follow_option


def _request(run_id: str, bundle: dict[str, Any]) -> tuple[Any, list[str]]:
    """The submission the bundle records, and what it lacks for an exact re-run."""
    from taugrid.core.contracts import SubmitRequested

    config, source = bundle.get("config") or {}, bundle.get("source") or {}
    resolved = bundle.get("resolved") or {}
    revision = int((bundle.get("platform") or {}).get("revision") or 0)
    missing = [what for what, value in (("the config text", config.get("text")),
                                        ("the source snapshot digest", source.get("digest")),
                                        ("the source snapshot object", source.get("object")),
                                        ("the platform revision", revision)) if not value]
    req = SubmitRequested(submission_id="", config_text=str(config.get("text") or ""),
                          config_path=str(config.get("path") or "tau.yaml"),
                          source_object=str(source.get("object") or ""), source_digest=str(source.get("digest") or ""),
                          python=str(resolved.get("python") or ""),
                          python_source=str(resolved.get("python_source") or ""),
                          reproduces=run_id, platform_revision=revision)
    return req, missing


@click.command(help="Re-run RUN exactly from its sealed evidence: the same config text, source snapshot (digest "
                    "re-checked) and platform revision. Refused (exit 5) when the evidence does not verify or "
                    "lacks a piece; prints the new run id.")
@click.argument("run_id")
@follow_option
@output_option
@run_async
async def reproduce(run_id: str, follow: bool, output: str) -> None:
    from taugrid.evidence.store import read_bundle
    from taugrid.evidence.verify import verify_run

    async with connected() as client:
        record = await client.status(run_id)  # an unknown run: exit 3
        report = await verify_run(client.bus, run_id, workspace=record.workspace)
        if not report.ok:
            fail(f"cannot reproduce {run_id}: its evidence does not verify: " + "; ".join(report.problems),
                 EXIT_REJECTED)
        got = await read_bundle(client.bus, run_id, workspace=record.workspace)
        if got is None:
            fail(f"cannot reproduce {run_id}: its evidence bundle is missing", EXIT_REJECTED)
            return
        req, missing = _request(run_id, got[1])
        if missing:
            fail(f"cannot reproduce {run_id}: its evidence lacks {', '.join(missing)}", EXIT_REJECTED)
        new_id = await client.submit_request(req, workspace=record.workspace, name=record.name or run_id,
                                             span="tau reproduce")
        if output == "json" and not follow:
            emit_json({"run_id": new_id, "reproduces": run_id, "platform_revision": req.platform_revision,
                       "source_digest": req.source_digest})
            return
        click.echo(new_id)
        if follow:
            from taugrid.cli.console import follow_run

            await follow_run(client, new_id, output)
