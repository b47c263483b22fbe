"""``tau outputs RUN [--copy DIR]``: where a run's outputs and checkpoints are, the files there, and a copy.

The listing comes from the evidence service: the sealed bundle's ``outputs`` section is its scan of the run's
output and checkpoint directories when the run ended (on Kubernetes, from the volume mounted into the evidence
service). Before the seal, a directory on this machine (the local backend) is scanned live. Copies come from
this machine's disk when the files are here, else from the object store, where the evidence service keeps
small files (``TAU_EVIDENCE_KEEP_OUTPUTS``); a file in neither place is named, never silently skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from taugrid.cli.common import EXIT_FAILED, connected, emit_json, output_option, run_async
from taugrid.core.quantity import human_bytes
from taugrid.core.states import RunRecord
from taugrid.evidence.bundle import scan_dir
from taugrid.local.scratch import warning

OUTPUTS_SCHEMA = "taugrid.io/outputs/v1"
_SHOWN = 5


async def listing(client: Any, record: RunRecord) -> dict[str, Any]:
    """The run's output and checkpoint directories and their files, with where the listing came from:
    ``evidence`` (sealed), ``live`` (scanned now, on this machine) or ``pending`` (elsewhere, not sealed)."""
    resolved = record.resolved
    out_dir = resolved.output_dir if resolved else ""
    ckpt_dir = resolved.checkpoint_dir if resolved else ""
    from taugrid.evidence.store import read_bundle  # the store brings nats-py: loaded only when asked

    got = await read_bundle(client.bus, record.run_id, workspace=record.workspace)
    section: dict[str, Any] = {}
    if got is not None:
        source, section = "evidence", dict(got[1].get("outputs") or {})
    elif out_dir and Path(out_dir).is_dir():
        source = "live"
        section = await asyncio.to_thread(
            lambda: {
                "output_dir": scan_dir(out_dir, metrics=False),
                "checkpoint_dir": scan_dir(ckpt_dir, metrics=False),
            }
        )
    else:
        source = "pending"
    empty = {"present": False, "files": [], "truncated": False}
    dirs = {
        key: {**empty, "path": path, **{k: v for k, v in (section.get(key) or {}).items() if k != "metrics"}}
        for key, path in (("output_dir", out_dir), ("checkpoint_dir", ckpt_dir))
    }
    for d in dirs.values():
        d["on_this_machine"] = bool(d["path"]) and Path(d["path"]).is_dir()
    return {
        "schemaVersion": OUTPUTS_SCHEMA,
        "run_id": record.run_id,
        "state": record.state,
        "source": source,
        **dirs,
        "scratch": list(section.get("scratch") or []),
    }


def _size(n: int) -> str:
    return human_bytes(n)


def _own_files(found: dict[str, Any]) -> list[dict[str, Any]]:
    """Output files less those in the checkpoint directory when it is nested in the output directory."""
    out, ckpt = found["output_dir"], found["checkpoint_dir"]["path"]
    prefix = ckpt[len(out["path"]) :].strip("/") + "/" if ckpt.startswith(out["path"] + "/") else ""
    return [f for f in out["files"] if not (prefix and f["path"].startswith(prefix))]


def _where(d: dict[str, Any], source: str) -> str:
    if source == "pending" and not d["on_this_machine"]:
        return "not on this machine; listed by the evidence service when the run ends"
    if not d["present"]:
        return "nothing written" if source == "evidence" else "nothing written yet"
    return ""


def _directories(found: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], list[dict[str, Any]], str]]:
    """(label, directory, its files, a note on where the listing stands) for the output directory (without the
    checkpoints nested in it) and the checkpoint directory, each only when the run has one."""
    for label, key in (("outputs", "output_dir"), ("checkpoints", "checkpoint_dir")):
        d = found[key]
        if d["path"]:
            files = _own_files(found) if key == "output_dir" else d["files"]
            yield label, d, files, _where(d, found["source"])


def summary_lines(found: dict[str, Any]) -> list[str]:
    """Lines for ``tau status``: each directory with its file count and first names, then scratch warnings."""
    lines = []
    for label, d, files, note in _directories(found):
        if not note:
            total = sum(int(f.get("size") or 0) for f in files)
            names = ", ".join(f["path"] for f in files[:_SHOWN]) + (", …" if len(files) > _SHOWN else "")
            note = f"{len(files)} file(s), {_size(total)}: {names}" if files else "empty"
        lines.append(f"  {label + ':':<13}{d['path']}  ({note})")
    for w in found["scratch"]:
        lines.append("  ! " + warning(w, found["output_dir"]["path"]).removeprefix("taugrid: "))
    return lines


async def _fetch(client: Any, found: dict[str, Any], dest: Path) -> tuple[int, list[str]]:
    """Copy every listed file under ``dest`` (checkpoints outside the output directory go to
    ``dest/checkpoints``); returns (copied, files that could not be fetched)."""
    copied, missing = 0, []
    out_path = found["output_dir"]["path"]
    plan = [(found["output_dir"], dest)]
    if not found["checkpoint_dir"]["path"].startswith(out_path + "/"):
        plan.append((found["checkpoint_dir"], dest / "checkpoints"))
    for d, target_root in plan:
        for f in d["files"]:
            if "sha256" not in f:
                continue
            target = target_root / f["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            here = Path(d["path"]) / f["path"]
            if d["on_this_machine"] and here.is_file():
                await asyncio.to_thread(shutil.copy2, here, target)
                copied += 1
                continue
            from taugrid.evidence.archive import read_object  # the bus, else the evidence archive

            data = (await read_object(client.bus, f["object"]))[0] if f.get("object") else None
            if data is not None and hashlib.sha256(data).hexdigest() == f["sha256"]:
                target.write_bytes(data)
                copied += 1
                continue
            missing.append(f"{d['path']}/{f['path']}")
    return copied, missing


@click.command(help="List a run's output and checkpoint files; --copy DIR fetches them.")
@click.argument("run_id")
@click.option(
    "--copy",
    "copy_to",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Copy the files into DIR (from this machine's disk, or from the object store where the evidence "
    "service kept a copy).",
)
@output_option
@run_async
async def outputs(run_id: str, copy_to: Path | None, output: str) -> None:
    async with connected() as client:
        record = await client.status(run_id)
        found = await listing(client, record)
        copied, missing = await _fetch(client, found, copy_to) if copy_to else (0, [])
    if copy_to:
        found["copied"] = {"to": str(copy_to), "files": copied, "not_fetched": missing}
    if output == "json":
        emit_json(found)
    else:
        _print(found)
    if missing:
        click.echo(
            f"error: {len(missing)} file(s) are only on the run's volume and were not kept in the object store "
            "(the evidence service keeps up to TAU_EVIDENCE_KEEP_OUTPUTS per run): read them from a pod that "
            "mounts the volume: " + ", ".join(missing[:_SHOWN]) + (", …" if len(missing) > _SHOWN else ""),
            err=True,
        )
        sys.exit(EXIT_FAILED)


def _print(found: dict[str, Any]) -> None:
    source = {"evidence": "the evidence bundle", "live": "this machine, now", "pending": "nowhere yet"}
    if not found["output_dir"]["path"]:
        click.echo(f"run {found['run_id']}  state {found['state']}: no output directory (the run was never "
                   "resolved by the policy stage)")
        return
    click.echo(f"run {found['run_id']}  state {found['state']}  (listing from {source[found['source']]})")
    for label, d, files, note in _directories(found):
        click.echo(f"{label:<12} {d['path']}" + (f"  ({note})" if note else ""))
        width = max((len(f["path"]) for f in files), default=0)
        for f in files:
            size = _size(int(f["size"])) if "size" in f else f.get("error", "?")
            kept = "  (copy in the object store)" if f.get("object") and not d["on_this_machine"] else ""
            click.echo(f"  {f['path']:<{width}}  {size:>10}{kept}")
        if d.get("truncated"):
            click.echo("  … (listing truncated)")
    for w in found["scratch"]:
        click.echo("warning: " + warning(w, found["output_dir"]["path"]).removeprefix("taugrid: "))
    if "copied" in found:
        click.echo(f"copied {found['copied']['files']} file(s) to {found['copied']['to']}")
