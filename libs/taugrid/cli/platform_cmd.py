"""``tau platform apply|show|render``: the platform policy (workspaces, queues, quotas, profiles)."""

from __future__ import annotations

from pathlib import Path

import click

from taugrid.cli.common import EXIT_NOT_FOUND, connected, emit_json, fail, output_option, run_async
from taugrid.config.platform import load_platform


@click.group(help="Govern workspaces, queues, quotas, compute profiles and priorities.")
def platform() -> None:
    pass


@platform.command(help="Validate FILE and store it as the next platform revision.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--backend",
    type=click.Choice(["local", "kubernetes"]),
    default="local",
    show_default=True,
    help="kubernetes also applies the rendered Kueue objects to the cluster.",
)
@output_option
@run_async
async def apply(file: Path, backend: str, output: str) -> None:
    text = file.read_text()
    load_platform(text, path=str(file))
    if backend == "kubernetes":
        from taugrid.kube.platform import apply_platform

        await apply_platform(load_platform(text, path=str(file)))
    async with connected() as client:
        revision = await client.platform_apply(text, path=str(file))
    if output == "json":
        emit_json({"revision": revision, "file": str(file)})
    else:
        click.echo(f"platform revision {revision} applied from {file}")


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
    help="Render FILE as Kueue objects (ResourceFlavor, Cohort, ClusterQueue, LocalQueue, "
    "WorkloadPriorityClass, kueue.x-k8s.io/v1beta2) as YAML."
)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@run_async
async def render(file: Path) -> None:
    from taugrid.render import to_yaml
    from taugrid.render.kueue import configuration_note, render_platform
    from taugrid.render.validate import validate

    p = load_platform(file.read_text(), path=str(file))
    objs = render_platform(p)
    for o in objs:
        validate(o)
    click.echo(to_yaml(objs), nl=False)
    note = configuration_note(p)
    if note:
        click.echo(note, err=True, nl=False)
