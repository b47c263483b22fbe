"""``tau run`` (submit, validate, schema), ``status``, ``logs``, ``list``, ``cancel`` (``events``: events_cmd)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from taugrid.cli.common import (
    EXIT_REJECTED,
    EXIT_USAGE,
    color,
    connected,
    data_dir,
    emit_json,
    fail,
    nats_url,
    output_option,
    run_async,
)
from taugrid.cli.views import (
    attempt_separator,
    elapsed,
    phase_tree,
    status_json,
    table,
    terminal_reason,
)
from taugrid.config.project import advice, check_project
from taugrid.config.source import format_issue, raise_issues
from taugrid.config.taujob import TauConfig, load_tau_config, tau_json_schema
from taugrid.core import paging
from taugrid.core.errors import ConfigError
from taugrid.core.states import RunRecord

follow_option = click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Show the stages and the script's output live; exit 0 only if the run succeeded.",
)


class DefaultGroup(click.Group):
    """``tau run [TARGET]`` submits; ``tau run validate|schema|resume`` are subcommands. The group's help shows
    the submit options too, since they are what ``tau run`` takes."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["submit", *args]
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        submit_cmd = self.commands["submit"]
        rows = [
            r
            for p in submit_cmd.get_params(ctx)
            if isinstance(p, click.Option) and (r := p.get_help_record(ctx)) is not None
        ]
        with formatter.section("Options (of `tau run [TARGET]`)"):
            formatter.write_dl(rows)
        self.format_commands(ctx, formatter)


def resolve_target(target: str) -> Path:
    """A file, a directory holding tau.yaml, or a target name resolving to tau/<target>.yaml."""
    p = Path(target)
    if p.is_dir():
        p = p / "tau.yaml"
    if p.is_file():
        if p.suffix not in (".yaml", ".yml"):
            fail(f"tau run takes a project folder or a tau.yaml: try `tau run {_project_of(p)}`", EXIT_USAGE)
        return p
    named = Path("tau") / f"{target}.yaml"
    if named.is_file():
        return named
    fail(
        f"no config at {target!r}: pass a tau.yaml path, a directory holding one, or a target name "
        f"with tau/{target}.yaml",
        EXIT_USAGE,
    )
    raise AssertionError


def _project_of(file: Path) -> str:
    """How to name the folder holding ``file`` on the command line (``.`` for the current one)."""
    parent = file.parent
    return "." if parent.resolve() == Path.cwd().resolve() else str(parent)


def _load_checked(path: Path) -> TauConfig:
    """The config at ``path`` with the project checks applied; warnings go to stderr."""
    cfg = load_tau_config(path.read_text(), path=str(path))
    raise_issues(check_project(cfg, path.parent.resolve()))
    for warning in [*map(format_issue, cfg.warnings), *advice(cfg)]:
        click.echo(color("warning: ", "yellow") + warning, err=True)
    return cfg


platform_file_option = click.option(
    "--platform", "platform_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="With --dry-run: render against this platform.yaml instead of the stack's (or this machine's default).",
)


@click.group(
    cls=DefaultGroup,
    subcommand_metavar="[TARGET] | COMMAND [ARGS]...",
    help="Submit a run: `tau run [TARGET]` (a project folder, a tau.yaml or a target name; default: the "
    "tau.yaml here), or validate a config.",
)
def run() -> None:
    pass


@run.command("submit", help="Submit TARGET (a project folder, a tau.yaml or a target name; default: ./tau.yaml).")
@click.argument("target", default="tau.yaml")
@follow_option
@click.option(
    "--workspace", "-w", default=None, help="Workspace (default: policy.workspace, else 'default')."
)
@click.option(
    "--dry-run", is_flag=True, help="Print the manifests that would be applied, as YAML; submit nothing."
)
@click.option(
    "--submission-id", default=None, help="Idempotency key: the same id always yields the same run."
)
@platform_file_option
@output_option
@run_async
async def submit(
    target: str, follow: bool, workspace: str | None, dry_run: bool, submission_id: str | None,
    platform_file: Path | None, output: str,
) -> None:
    path = resolve_target(target)
    if platform_file is not None and not dry_run:
        fail("--platform is for --dry-run (a submission is always checked against the stack's platform)",
             EXIT_USAGE)
    cfg = _load_checked(path)
    if dry_run:
        await _dry_run(path, cfg, workspace, platform_file)
        return
    async with connected() as client:
        run_id = await client.submit(path, workspace=workspace, submission_id=submission_id, config=cfg)
        _say_whose_python(path.parent.resolve())
        if output == "json" and not follow:
            emit_json({"run_id": run_id})
            return
        click.echo(run_id)
        if follow:
            from taugrid.cli.console import follow_run  # its views and the evidence scan load only to follow

            await follow_run(client, run_id, output)


def _say_whose_python(project: Path) -> None:
    """A note when taugrid's own environment (active, or first on PATH) was passed over for the run's Python."""
    from taugrid.client.interpreter import own_environment_note

    note = own_environment_note(project)
    if note:
        click.echo(color("note: ", "cyan") + note, err=True)


async def _dry_run(path: Path, cfg: Any, workspace: str | None, platform_file: Path | None) -> None:
    """The manifests a submission would apply, rendered against ``platform_file``, else the stack's platform,
    else (no stack answers, or it has no platform yet) this machine's default one; works with no stack."""
    from taugrid.render import RenderSettings, render, to_yaml
    from taugrid.render.validate import validate
    from taugrid.sources.archive import snapshot, source_object

    if platform_file is not None:
        text, revision = platform_file.read_text(), 0
    else:
        got, why = await _stack_platform()
        if got is None:
            from taugrid.stack.machine_platform import machine_platform_yaml

            click.echo(color("note: ", "yellow") + "dry-run " + MACHINE_CHECKED.format(why=why), err=True)
            got = machine_platform_yaml(data_dir()), 0
        text, revision = got
    # The snapshot a real submission would ship (computed, not uploaded), so the manifests show its fetch.
    from taugrid.config.project import project_root

    root, subdir = project_root(cfg, path.parent)
    _, digest = snapshot(root, extra_excludes=list(cfg.run.working_dir_excludes or []))
    run_spec = _resolve(cfg, text, revision, purpose="dry-run", workspace=workspace,
                        source_object=source_object(digest), source_digest=digest, project_subdir=subdir)
    manifests = render(run_spec, attempt=1, settings=RenderSettings.from_env())
    for m in manifests:
        validate(m)
    click.echo(to_yaml(manifests), nl=False)


def from_option(what: str) -> Any:
    return click.option(
        "--from", "from_project", default=None, metavar="DIR|tau.yaml",
        help=f"Run the project's tau.yaml and code as they are now (`--from .` in the project folder) instead of "
             f"RUN's own, as submitted; {what}",
    )


def _project(value: str | None) -> Path | None:
    """The tau.yaml ``--from`` names: a project folder holding one, or the file itself."""
    if value is None:
        return None
    p = Path(value)
    found = p / "tau.yaml" if p.is_dir() else p
    if not (found.is_file() and found.suffix in (".yaml", ".yml")):
        fail(f"--from takes a project folder holding a tau.yaml, or the tau.yaml itself: {value!r} is neither "
             "(the checkpoint to resume from is `--checkpoint PATH`)", EXIT_USAGE)
    _load_checked(found)  # the same checks and warnings as `tau run`
    return found


async def _again_done(client: Any, again: Any, key: str, follow: bool, output: str) -> None:
    if output == "json" and not follow:
        emit_json({"run_id": again.run_id, key: again.of, **again.as_json()})
        return
    click.echo(again.run_id)
    click.echo(color("note: ", "cyan") + again.describe(), err=True)
    if follow:
        from taugrid.cli.console import follow_run

        await follow_run(client, again.run_id, output)


@run.command(
    "resume",
    help="Start a new run from RUN's last checkpoint (TAU_RESUME_FROM), with RUN's config and code as submitted or, "
    "with --from, the project's as they are now; says which, and prints the new run id. After an OOMKilled run it "
    "is refused unless --from's compute differs from RUN's or --force is given.",
)
@click.argument("run_id")
@from_option("the new run still starts from RUN's checkpoint.")
@click.option("--checkpoint", default="", metavar="PATH", help="Checkpoint directory (default: RUN's checkpoint dir).")
@click.option("--force", is_flag=True, help="Resume even though RUN was OOMKilled and its memory is unchanged.")
@follow_option
@output_option
@run_async
async def resume(run_id: str, from_project: str | None, checkpoint: str, force: bool, follow: bool,
                 output: str) -> None:
    project = _project(from_project)
    async with connected() as client:
        again = await client.resume(run_id, checkpoint=checkpoint, force=force, project=project)
        await _again_done(client, again, "resumes", follow, output)


@run.command(
    "retry",
    help="Start a new run of RUN from the start (RUN must have finished), with RUN's config and code as submitted "
    "or, with --from, the project's as they are now; says which, and prints the new run id. `tau run resume` "
    "starts from RUN's checkpoint instead.",
)
@click.argument("run_id")
@from_option("an edited tau.yaml (a raised compute.memory_limit) or fixed code is what runs.")
@follow_option
@output_option
@run_async
async def retry(run_id: str, from_project: str | None, follow: bool, output: str) -> None:
    project = _project(from_project)
    async with connected() as client:
        again = await client.retry(run_id, project=project)
        await _again_done(client, again, "retries", follow, output)


@run.command(
    "validate",
    help="Check a tau.yaml (or a project folder): the file, the project (the entrypoint exists) and the platform "
    "(workspace, profiles, quotas): the stack's current one when it answers, else this machine's default (the "
    "one `tau up` creates), saying which. Exit 2 with every problem.",
)
@click.argument("target", default="tau.yaml")
@click.option("--offline", is_flag=True, help="Do not contact the stack; check against this machine's default "
              "platform (the one `tau up` creates).")
@click.option("--strict", is_flag=True, help="Treat warnings (a managed manifest's unknown keys, keys that change "
              "nothing here) as errors: exit 2.")
@click.option("--workspace", "-w", default=None, help="Check it as `tau run --workspace` would submit it (default: "
              "policy.workspace, else 'default').")
@output_option
@run_async
async def validate(target: str, offline: bool, strict: bool, workspace: str | None, output: str) -> None:
    path = resolve_target(target)
    try:
        cfg = load_tau_config(path.read_text(), path=str(path))
        if strict:
            raise_issues(cfg.warnings)
        raise_issues(check_project(cfg, path.parent.resolve()))
        from taugrid.config.project import project_root

        # the folder a submission would ship and where tau.yaml sits in it, as `tau run` works them out: a managed
        # script beside the config's folder (TauGrid's AKS CPU quickstart) is inside the snapshot then
        _, subdir = project_root(cfg, path.parent)
        revision, checked = (
            (None, _check_against_machine(cfg, "--offline", workspace, project_subdir=subdir)) if offline
            else await _check_against_platform(cfg, workspace, project_subdir=subdir)
        )
    except ConfigError as err:
        if output == "json":
            emit_json({"valid": False, "issues": err.issues})
            sys.exit(EXIT_USAGE)
        fail(str(err), EXIT_USAGE)
        return
    warnings = [*map(format_issue, cfg.warnings), *advice(cfg)]
    checked = f"against platform revision {revision}" if revision else checked
    if output == "json":
        emit_json(
            {"valid": True, "name": cfg.name, "engine": cfg.engine, "platform_revision": revision,
             "platform": "stack" if revision else "machine-default", "warnings": warnings,
             "managed": cfg.managed, "warning_issues": cfg.warnings}
        )
        return
    for warning in warnings:
        click.echo(color("warning: ", "yellow") + warning, err=True)
    click.echo(f"{path} ({cfg.engine} run {cfg.name!r}): valid {checked}")


async def _stack_platform() -> tuple[tuple[str, int] | None, str]:
    """The stack's current platform text and revision, or None and why not (no stack answers, or it has none)."""
    from taugrid.client import open_client
    from taugrid.core.errors import TemporaryError

    try:
        client = await open_client(nats_url(), connect_timeout=2.0, max_reconnect_attempts=1)
    except TemporaryError:
        return None, "no stack answered"
    try:
        return await client.platform_get(), "the stack has no platform yet"
    finally:
        await client.close()


async def _check_against_platform(cfg: TauConfig, workspace: str | None = None, *,
                                  project_subdir: str = "") -> tuple[int | None, str]:
    """Resolve ``cfg`` as the policy service would: against the stack's current platform (its revision, "")
    when a stack answers, else against this machine's default platform, the one `tau up` creates (None, and
    a note saying so)."""
    got, why = await _stack_platform()
    if got is not None:
        text, revision = got
        _resolve(cfg, text, revision, purpose="validate", workspace=workspace, project_subdir=project_subdir)
        return revision, ""
    return None, _check_against_machine(cfg, why, workspace, project_subdir=project_subdir)


MACHINE_CHECKED = "against this machine's default platform, the one `tau up` creates ({why})"


def _check_against_machine(cfg: TauConfig, why: str, workspace: str | None = None, *,
                           project_subdir: str = "") -> str:
    """Resolve ``cfg`` against this machine's default platform; the note that says so. A problem raises the
    ConfigError with that note added, so the reader knows which platform refused it."""
    from taugrid.stack.machine_platform import machine_platform_yaml

    note = MACHINE_CHECKED.format(why=why)
    try:
        _resolve(cfg, machine_platform_yaml(data_dir()), 0, purpose="validate", workspace=workspace,
                 project_subdir=project_subdir)
    except ConfigError as err:
        raise ConfigError(f"{err}\n(checked {note})",
                          issues=[{**i, "platform": "machine-default"} for i in err.issues]) from err
    return note


def _resolve(cfg: TauConfig, platform_text: str, revision: int, *, purpose: str, workspace: str | None = None,
             source_object: str = "", source_digest: str = "", project_subdir: str = "") -> Any:
    """``cfg`` resolved against a platform's text as the policy service would (a ConfigError if it refuses)."""
    from taugrid.config.platform import load_platform
    from taugrid.config.resolve import resolve_run
    from taugrid.config.taujob import config_hash

    return resolve_run(cfg, load_platform(platform_text), run_id=f"{cfg.name}-{purpose}", submission_id=purpose,
                       workspace=workspace, platform_revision=revision, config_hash=config_hash(cfg),
                       source_object=source_object, source_digest=source_digest, project_subdir=project_subdir)


@run.command("schema", help="Print the tau.yaml JSON Schema (draft 2020-12).")
def schema() -> None:
    click.echo(json.dumps(tau_json_schema(), indent=2))


@click.command(
    help="Show a run's phase tree: submitted → policy → rendered → Kueue admission → RayCluster (RayJobs) → "
    "pod scheduling → image pull → init containers → container start → running → finished, with a tip per "
    "problem, and its pods. With --stack (and no RUN_ID): the embedded stack's services, replicas and pids."
)
@click.argument("run_id", required=False)
@click.option("--stack", "stack", is_flag=True, help="Show the embedded stack's services and replicas instead "
              "(as `tau stack`).")
@output_option
@run_async
async def status(run_id: str | None, stack: bool, output: str) -> None:
    from taugrid.cli.outputs_cmd import listing, summary_lines

    if stack or not run_id:
        if not stack:
            fail("tau status needs a RUN_ID (see `tau list`), or --stack for the stack's services", EXIT_USAGE)
        from taugrid.cli.stack import show_stack

        show_stack(output)
        return
    async with connected() as client:
        record = await client.status(run_id)
        found = await listing(client, record)
    if output == "json":
        emit_json({**status_json(record), "outputs": found})
    else:
        click.echo(phase_tree(record))
        for line in summary_lines(found):
            click.echo(line)


@click.command("list", help="List runs, newest first: AGE is the time since submission.")
@click.option("--workspace", "-w", default=None, help="Only runs in this workspace.")
@click.option(
    "--state",
    "states",
    multiple=True,
    help="Only runs in this state (repeatable): submitted, queued, running, succeeded, failed, rejected, "
    "cancelled, …; `active` means any unfinished state.",
)
@click.option("--user", "-u", default=None, help="Only runs submitted by this user.")
@click.option("--limit", "-n", default=paging.DEFAULT_LIMIT, show_default=True, type=click.IntRange(min=0),
              help="Show at most this many runs (0: all).")
@click.option("--cursor", default="", metavar="CURSOR",
              help="Start after this cursor: the `next` of a previous page (printed last, or in --output json).")
@output_option
@run_async
async def list_runs(
    workspace: str | None, states: tuple[str, ...], user: str | None, limit: int, cursor: str, output: str
) -> None:
    if cursor:
        try:
            paging.decode_cursor(cursor, param="value")
        except paging.BadPage as exc:
            raise click.BadParameter(str(exc), param_hint="--cursor") from None
    async with connected() as client:
        records = await client.list()
    wanted = set(states)
    records = [
        r
        for r in records
        if (not workspace or r.workspace == workspace)
        and (not user or r.user == user)
        and (not wanted or r.state in wanted or ("active" in wanted and r.finished is None))
    ]
    records, nxt = paging.page(records, limit=limit or None, after=cursor)
    if output == "json":
        emit_json({
            "runs": [
                {**{k: v for k, v in status_json(r).items() if k not in ("resolved", "phases", "pods")},
                 "why": terminal_reason(r)}
                for r in records
            ],
            "next": nxt or None,
        })
        return
    now = time.time()
    rows = [
        [
            r.run_id,
            r.workspace,
            r.user or "-",
            r.state,
            str(r.attempt),
            elapsed(r.created, now),
            elapsed(r.created, r.finished),
            terminal_reason(r)[:60],
        ]
        for r in records
    ]
    click.echo(table(rows, ["run", "workspace", "user", "state", "attempt", "age", "duration", "reason"]))
    if nxt:
        click.echo(f"more runs: add --cursor {nxt} (with the same filters) for the next page", err=True)


@click.command(help="Cancel a run: its process gets SIGTERM, then SIGKILL after the grace period. Only the "
               "run's submitter, an admin of its workspace or a platform admin may; exit 5 with the reason "
               "when the platform refuses.")
@click.argument("run_id")
@output_option
@run_async
async def cancel(run_id: str, output: str) -> None:
    from taugrid.client import CancelRefused

    async with connected() as client:
        record = await client.status(run_id)
        already = _already_cancelled(record)
        if already:
            if output == "json":
                emit_json({"run_id": run_id, "cancel": already, "state": record.state})
            else:
                click.echo(f"{run_id}: {already}")
            return
        try:
            decision = await client.cancel(run_id)
        except CancelRefused as refused:
            if output == "json":
                emit_json({"run_id": run_id, "cancel": "refused", "reason": str(refused),
                           "field": refused.decision.field, "by": refused.decision.by})
            fail(f"cancel refused: {refused}", EXIT_REJECTED)
            return
    outcome = "accepted" if decision is not None else "requested"
    if output == "json":
        emit_json({"run_id": run_id, "cancel": outcome, "by": decision.by if decision else ""})
    elif decision is not None:
        click.echo(f"cancel accepted for {run_id} (by {decision.by})")
    else:
        click.echo(f"cancel requested for {run_id} (it had finished, or no answer yet: see `tau status {run_id}`)")


def _already_cancelled(record: RunRecord) -> str:
    """Why a cancel would do nothing (``already cancelling``, ``already cancelled``, ``already <state>``)."""
    if record.state == "cancelled":
        return "already cancelled"
    if record.finished:
        return f"already {record.state}"
    return "already cancelling" if record.cancel_requested else ""


@click.command(help="Print a run's output, every attempt (each after a separator); -f follows until it ends.")
@click.argument("run_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the run has finished.")
@output_option
@run_async
async def logs(run_id: str, follow: bool, output: str) -> None:
    shown = 1
    async with connected() as client:
        async for chunk in client.logs(run_id, follow=follow):
            if output != "json" and chunk.attempt != shown:
                shown = chunk.attempt
                click.echo(attempt_separator(shown))
            for line in chunk.lines:
                if output == "json":
                    emit_json({"run_id": run_id, "attempt": chunk.attempt, "pod": chunk.pod, "line": line})
                else:
                    click.echo(line)
