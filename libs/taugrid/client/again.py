"""A finished run submitted again as a new run: ``tau run retry`` (from the start) and ``tau run resume`` (from its
last checkpoint).

What the new run runs is said, never guessed: by default the old run's own config text and source snapshot, as
submitted; with a project (``--from DIR``), that project's tau.yaml and code as they are now, so an edit (a raised
``compute.memory_limit``, a fixed script) is what runs. ``Again`` records which, and whether it differs from the
old run's. A run killed for its memory (OOMKilled) resumes only with ``force`` or with a project whose ``compute``
differs from the run's: the same config would be killed the same way. The new run goes to the old run's workspace.
(The snapshot holds tau.yaml too, so "its files differ" alone does not say the code changed.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from taugrid.config.taujob import TauConfig, load_tau_config, load_tau_config_shared
from taugrid.core.classify import classify
from taugrid.core.contracts import SubmitRequested
from taugrid.core.errors import ConfigError, NotFound, PermanentError
from taugrid.core.ids import token
from taugrid.core.states import TERMINAL, RunRecord

if TYPE_CHECKING:
    from taugrid.client.client import Client


@dataclass(frozen=True)
class Again:
    """The new run, the run it repeats (``of``), and what it runs: the old run's own config and code (``project``
    "") or the project's (``project``: its tau.yaml) as they are now, and whether those differ from the old run's."""

    run_id: str
    of: str
    project: str = ""
    config_changed: bool = False  # the tau.yaml text differs from the old run's
    files_changed: bool = False  # the project's snapshot (its code, tau.yaml included) differs from the old run's

    def describe(self) -> str:
        """One line saying which config and code the new run uses."""
        if not self.project:
            return (f"{self.run_id} runs {self.of}'s config and code as submitted (`--from .` runs the project's "
                    "current tau.yaml and code instead)")
        if not self.files_changed:
            since = f"the same files as {self.of}'s"
        else:
            since = f"its files differ from {self.of}'s; tau.yaml {'changed' if self.config_changed else 'is the same'}"
        return f"{self.run_id} runs {self.project} and its project's code as they are now ({since})"

    def as_json(self) -> dict[str, object]:
        return {"config": "project" if self.project else "run", "project": self.project or None,
                "config_changed": self.config_changed, "files_changed": self.files_changed}


def was_oom(record: RunRecord) -> bool:
    """Whether the run ended killed for its memory (a give-up's reason starts with the attempt's own)."""
    return classify(record.reason.split(":", 1)[0].strip(), record.exit_code) == "oom"


async def retry(client: Client, run_id: str, *, submission_id: str | None = None,
                project: Path | None = None) -> Again:
    record = await client.status(run_id)
    await client._workspace_still_there(record, "tau run retry")  # first: said before anything else is read
    original = await _original(client, record)
    new = await client.project_request(project) if project is not None else None
    return await _submit(client, record, original, new, project=project, submission_id=submission_id,
                         retries=run_id, span="tau run retry")


async def resume(client: Client, run_id: str, *, checkpoint: str = "", force: bool = False,
                 submission_id: str | None = None, project: Path | None = None) -> Again:
    record = await client.status(run_id)
    await client._workspace_still_there(record, "tau run resume")
    original = await _original(client, record)
    if was_oom(record) and not force:
        if project is None:
            raise PermanentError(
                f"run {run_id} was OOMKilled and its config would be killed the same way: raise "
                f"compute.memory_limit in tau.yaml, then `tau run resume {run_id} --from .` (the project's current "
                "config and code), or pass --force to resume it as it was")
        if load_tau_config(project.read_text(), path=str(project)).compute == _compute(original):
            raise PermanentError(
                f"run {run_id} was OOMKilled and {project} leaves compute as it was: raise compute.memory_limit "
                "there, or pass --force to resume it anyway")
    resume_from = checkpoint or (record.resolved.checkpoint_dir if record.resolved else "")
    if not resume_from:
        raise PermanentError(f"run {run_id} has no checkpoint directory; pass --checkpoint PATH")
    new = await client.project_request(project) if project is not None else None
    return await _submit(client, record, original, new, project=project, submission_id=submission_id,
                         resume_from=resume_from, resumes=run_id, span="tau run resume")


async def _original(client: Client, record: RunRecord) -> SubmitRequested:
    """The request that submitted ``record``'s run, once it has finished."""
    run_id = record.run_id
    if record.state not in TERMINAL:
        raise PermanentError(f"run {run_id} is still {record.state}: cancel it first (`tau cancel {run_id}`)")
    # `submit.>`: the request travels on `submit.requested` or, in the high lane, `submit.requested.high`; read
    # from HISTORY, where a run's events stay (``replay.follow``)
    async for ev in client.replay(f"run.{token(record.workspace)}.{token(run_id)}.submit.>"):
        if ev.type == "submit.requested":
            return ev.payload(SubmitRequested)
    raise NotFound(f"the submission of {run_id} is no longer in HISTORY (a run's events are kept for "
                   "retention.runs.max_age)")


def _compute(req: SubmitRequested) -> object:
    try:
        return load_tau_config_shared(req.config_text, path=req.config_path).compute
    except ConfigError:
        return None


async def _submit(client: Client, record: RunRecord, original: SubmitRequested,
                  new: tuple[SubmitRequested, TauConfig] | None, *, project: Path | None, submission_id: str | None,
                  span: str, resume_from: str = "", resumes: str = "", retries: str = "") -> Again:
    """Submit ``record``'s run again as a new run, in its workspace: its original request, or ``new``."""
    req, name = original, record.name or record.run_id
    if new is not None:
        req, name = new[0], new[1].name or name
    req = msgspec.structs.replace(req, resume_from=resume_from, resumes=resumes, retries=retries)
    new_id = await client.submit_request(req, workspace=record.workspace, name=name, span=span,
                                         submission_id=submission_id)
    return Again(run_id=new_id, of=record.run_id, project=str(project) if project is not None else "",
                 config_changed=req.config_text != original.config_text,
                 files_changed=req.source_digest != original.source_digest)
