"""``tau platform apply|show|render``: the platform policy (workspaces, queues, quotas, profiles).

``apply`` plans first (``client/platformplan``): it prints every change against the stored revision, keeps the
people the file does not list, refuses to drop a workspace with runs or members unless ``--prune``, and stores
nothing when nothing changes, so ``tau platform show``'s output applied again is a no-op.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from taugrid.cli.common import EXIT_NOT_FOUND, EXIT_USAGE, connected, emit_json, fail, output_option, run_async
from taugrid.config.platform import Platform, load_platform
from taugrid.config.platformdiff import inert_here, retention_note

if TYPE_CHECKING:
    from taugrid.client.platformplan import Plan


@click.group(help="Govern workspaces, queues, quotas, compute profiles and priorities.")
def platform() -> None:
    pass


@platform.command(help="Validate FILE, show what it changes (workspaces, users, queues, quotas, ...) and store it as "
                  "the next platform revision. People the platform has and FILE does not list are kept (`tau admin "
                  "user` owns them); a workspace FILE drops that has runs or members is refused unless --prune.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--backend",
    type=click.Choice(["local", "kubernetes"]),
    default="local",
    show_default=True,
    help="kubernetes also applies the rendered Kueue objects to the cluster.",
)
@click.option("--prune", is_flag=True, help="Store FILE as it is: remove the users, groups, memberships and "
              "workspaces (even with runs or members) that it does not list.")
@click.option("--dry-run", is_flag=True, help="Show what would change and store nothing (exit 2 if it would be "
              "refused).")
@output_option
@run_async
async def apply(file: Path, backend: str, prune: bool, dry_run: bool, output: str) -> None:
    from taugrid.client.platformplan import PlatformRefused

    text = file.read_text()
    _say_inert(load_platform(text, path=str(file)), backend)  # refuse an invalid file before connecting
    async with connected() as client:
        if dry_run or backend == "kubernetes":
            planned = await client.platform_plan(text, path=str(file), prune=prune)
            if planned.blocked or dry_run:
                _report(planned, applied=False, revision=planned.revision, dry_run=dry_run, output=output)
                if planned.blocked:
                    fail(planned.refusal(), EXIT_USAGE)
                return
            from taugrid.kube.platform import apply_platform

            await apply_platform(planned.platform)
        try:
            planned, revision = await client.platform_apply(text, path=str(file), prune=prune)
        except PlatformRefused as refused:
            _report(refused.plan, applied=False, revision=refused.plan.revision, dry_run=False, output=output)
            fail(refused.plan.refusal(), EXIT_USAGE)
            return
    _report(planned, applied=revision != planned.revision, revision=revision, dry_run=False, output=output)


def _say_inert(p: Platform, backend: str) -> None:
    """On stderr (stdout stays the plan, or its JSON): what the file declares that this backend does not act on."""
    notes = [f"note: {n}\n" for n in inert_here(p, backend)]
    if backend == "kubernetes":  # Kueue's controller Configuration: no API object, so apply cannot set it
        from taugrid.render import kueueconfig
        from taugrid.render.kueue import configuration_note

        notes.append(configuration_note(p) + kueueconfig.note(p))
    text = "".join(notes)
    if text:
        click.echo(text, err=True, nl=False)


def _report(planned: Plan, *, applied: bool, revision: int, dry_run: bool, output: str) -> None:
    if output == "json":
        emit_json(planned.to_json(applied=applied, revision=revision, dry_run=dry_run))
        return
    for change in [*planned.changes, *planned.kept]:
        for line in change.lines():
            click.echo(f"  {line}")
    since = f"since revision {planned.revision}" if planned.revision else "in the first revision"
    if applied:
        click.echo(f"platform revision {revision} applied from {planned.path} ({len(planned.changes)} change(s) "
                   f"{since})")
        note = retention_note(list(planned.changes))
        if note:
            click.echo(f"note: {note}")
    elif not planned.changes and planned.revision:
        click.echo(f"{planned.path} changes nothing: the platform stays at revision {planned.revision}")
    elif dry_run:
        click.echo(f"dry run: {len(planned.changes)} change(s) {since}; nothing stored")


@platform.command(help="Print the current platform policy and its revision.")
@output_option
@run_async
async def show(output: str) -> None:
    async with connected() as client:
        got = await client.platform_get()
    if got is None:
        fail("no platform applied yet", EXIT_NOT_FOUND)
        return
    text, revision = got
    if output == "json":
        emit_json({"revision": revision, "platform": load_platform(text).model_dump(mode="json")})
    else:
        click.echo(f"# revision {revision}\n{text}")


@platform.command(
    help="Render FILE as Kueue objects (Topology, ResourceFlavor, Cohort, ClusterQueue, LocalQueue, "
    "WorkloadPriorityClass, kueue.x-k8s.io/v1beta2) and, for departments, KAI Queues, as YAML."
)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@run_async
async def render(file: Path) -> None:
    from taugrid.render import kueueconfig, to_yaml
    from taugrid.render.kueue import configuration_note, render_platform
    from taugrid.render.validate import validate

    p = load_platform(file.read_text(), path=str(file))
    objs = render_platform(p)
    for o in objs:
        validate(o)
    click.echo(to_yaml(objs), nl=False)
    note = configuration_note(p) + kueueconfig.note(p)  # what Kueue's ConfigMap needs, not API objects
    if note:
        click.echo(note, err=True, nl=False)
