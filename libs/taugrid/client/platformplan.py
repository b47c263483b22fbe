"""``tau platform apply`` as a plan, then a write: the file merged onto the stored revision, what that changes,
and what it would lose.

The stored revision owns the platform's people (``config/platformdiff``): a file applied onto it keeps every
user, group and membership it does not mention, and a workspace the file drops that still has runs or members
is refused, naming them, unless ``prune`` (then the file is stored as it is and its diff says what goes).
Invariants: a plan that changes nothing is never written (applying ``tau platform show``'s output is a no-op);
the write is a compare-and-set against the revision planned on, so a change made meanwhile (``tau admin user
add``) is re-read and merged, never overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from taugrid.bus import kv, platformstore
from taugrid.bus.connection import Bus
from taugrid.bus.platformread import PlatformReader
from taugrid.config.platform import Platform, load_platform
from taugrid.config.platformdiff import Change, diff, merge_people
from taugrid.core.errors import ConfigError, PermanentError, TemporaryError
from taugrid.core.ids import token

SCHEMA = "taugrid.io/platform-apply/v1"
ATTEMPTS = 3  # plan and write again when someone else wrote the platform in between


@dataclass(frozen=True)
class Dropped:
    """A workspace the file leaves out that still has runs or members."""

    workspace: str
    runs: int
    members: tuple[str, ...]

    def why(self) -> str:
        parts = [f"{self.runs} run{'s' * (self.runs != 1)}"] if self.runs else []
        parts += [f"members: {', '.join(self.members)}"] if self.members else []
        return "; ".join(parts)


@dataclass(frozen=True)
class Plan:
    path: str
    prune: bool
    revision: int  # the stored revision planned on (0: none yet)
    platform: Platform  # what would be stored
    text: str
    changes: tuple[Change, ...]  # against the stored revision
    kept: tuple[Change, ...]  # people and memberships the file does not mention, kept
    blocked: tuple[Dropped, ...]  # dropped workspaces that refuse the plan (none with ``prune``)

    def refusal(self) -> str:
        named = " and ".join(f"workspace {d.workspace!r} ({d.why()})" for d in self.blocked)
        it, its = ("them", "their") if len(self.blocked) > 1 else ("it", "its")
        return (f"{self.path} would remove {named}; nothing was applied. Keep {it} in {self.path} (`tau platform "
                f"show` prints the current platform), or pass --prune to remove {it}: {its} runs can no longer be "
                f"retried and {its} members lose {it}")

    def to_json(self, *, applied: bool, revision: int, dry_run: bool) -> dict[str, Any]:
        return {"schema": SCHEMA, "file": self.path, "previous_revision": self.revision or None,
                "revision": revision or None, "applied": applied, "dry_run": dry_run, "prune": self.prune,
                "changes": [c.to_json() for c in self.changes], "kept": [c.to_json() for c in self.kept],
                "refused": [{"workspace": d.workspace, "runs": d.runs, "members": list(d.members)}
                            for d in self.blocked]}


class PlatformRefused(PermanentError):
    """The plan would remove a workspace that has runs or members, and ``prune`` was not given."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan.refusal())
        self.plan = plan


async def plan(bus: Bus, text: str, *, path: str, prune: bool) -> Plan:
    """What applying ``text`` (the file at ``path``) would store and change; nothing is written."""
    wanted = load_platform(text, path=path)
    got = await platformstore.get_text(bus)
    revision = got[1] if got else 0
    before = await _stored(bus, got[0]) if got else Platform()
    merged = merge_people(before, wanted, file_name=path) if not prune else None
    target = merged.platform if merged else wanted
    dropped = [d for d in [await _dropped(bus, before, name) for name in _removed_workspaces(before, target)] if d]
    changes = [_explained(c, dropped) for c in diff(before, target)]
    return Plan(path=path, prune=prune, revision=revision, platform=target, text=_text(text, wanted, target, path),
                changes=tuple(changes), kept=merged.kept if merged else (),
                blocked=() if prune else tuple(dropped))


async def store(bus: Bus, planned: Plan) -> int:
    """Write the plan as the next revision (its number); ``PlatformRefused`` for a blocked plan; ``Conflict``
    when the platform changed since it was planned."""
    if planned.blocked:
        raise PlatformRefused(planned)
    return await platformstore.put_text(bus, planned.text, revision=planned.revision)


async def apply(bus: Bus, text: str, *, path: str, prune: bool) -> tuple[Plan, int]:
    """Plan and store; (the plan, the new revision, or the unchanged one when nothing changes)."""
    for attempt in range(ATTEMPTS):
        planned = await plan(bus, text, path=path, prune=prune)
        if not planned.changes and planned.revision:
            return planned, planned.revision
        try:
            return planned, await store(bus, planned)
        except kv.Conflict:
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


async def _stored(bus: Bus, text: str) -> Platform:
    """The stored platform; when its newest text does not validate (written behind `tau platform apply`'s back),
    the newest revision that does, as the services use (none: an empty platform)."""
    try:
        return load_platform(text)
    except ConfigError:
        try:
            good = await PlatformReader(bus).get()
        except TemporaryError:
            return Platform()
        return good[0] if good else Platform()


def _removed_workspaces(before: Platform, after: Platform) -> list[str]:
    keep = {w.name for w in after.workspaces}
    return [w.name for w in before.workspaces if w.name not in keep]


async def _dropped(bus: Bus, before: Platform, workspace: str) -> Dropped | None:
    ws = before.workspace(workspace)
    members = tuple(dict.fromkeys([*ws.members, *ws.admins])) if ws else ()
    runs = await kv.count_keys(bus, "run_state", f"run.{token(workspace)}.*")
    return Dropped(workspace, runs, members) if runs or members else None


def _explained(change: Change, dropped: list[Dropped]) -> Change:
    """A removal with what it takes away: a workspace's runs and members, a person's credentials."""
    if change.action != "remove":
        return change
    if change.kind == "workspace":
        found = next((d for d in dropped if d.workspace == change.name), None)
        return Change(change.kind, change.name, "remove", (found.why() if found else "no runs, no members",))
    if change.kind == "user":
        return Change(change.kind, change.name, "remove", ("their credentials are refused from now on",))
    return change


def _text(text: str, wanted: Platform, target: Platform, path: str) -> str:
    """The file's own text when it is what is stored (comments kept), else the merged platform as YAML."""
    if target == wanted:
        return text
    data = target.model_dump(mode="json", exclude_defaults=True)
    return (f"# {path} merged with the people the platform already had, by `tau platform apply`\n"
            + yaml.safe_dump(data, sort_keys=False))
