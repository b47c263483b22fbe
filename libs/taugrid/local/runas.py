"""Which OS user a local pod's processes run as, and the files that user may reach.

A run executes the researcher's code, which must not read the platform's keys (``creds/``), another workspace's
secrets or outputs, or another run's ``/proc/<pid>/environ``. On a stack that runs as root, every workspace's pods
run as that workspace's own unprivileged OS user, ``tau-ws-<workspace>`` (created here once, with ``useradd
--system``, no home, no login shell; its own group), and the stack's files are closed to it: the data dir is
traverse-only (0711) and its private parts 0700 (:func:`close_data_dir`). A pod's shim stays root and drops to
that user only for the containers' processes (``podspec.ContainerRun.uid``); what a pod must write is given to it
(:func:`give`): its working directory and volumes, its termination files, a home of its own, its output and
checkpoint directories. ``/proc/<pid>/environ`` is readable only by its process's own user, so another uid
closes it whether or not ``/proc`` is mounted with ``hidepid``.

The mode (``TAU_RUN_AS``): ``workspace`` (per-workspace users; needs root), ``stack`` (pods run as the stack's
own user, as before: a run can read everything the stack can), or unset: ``workspace`` when the stack runs as
root, its data dir can be reached by another user (root's default, ``/var/lib/taugrid``, can: see
``taugrid.settings``) and so can an interpreter runs fall back to (``TAU_LOCAL_PYTHON``, else
``ownenv.clean_pythons``: the base of taugrid's venv, else the system's ``python3``), else ``stack``, with the
reason (:func:`decide`, which ``tau up`` prints as a warning and the supervisor records in ``stack.json``).

Invariants: a run user is never uid 0, and an existing OS user of that name that taugrid did not create is
refused, never used; ``give`` never follows a symbolic link and never touches a path outside the ones it is given.
"""

from __future__ import annotations

import errno
import getpass
import hashlib
import os
import pwd
import re
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from taugrid import settings
from taugrid.local.ownenv import clean_pythons

ENV = "TAU_RUN_AS"
WORKSPACE, STACK = "workspace", "stack"
PREFIX = "tau-ws-"
MAX_NAME = 32  # useradd's limit on Linux
COMMENT = "taugrid runs of workspace "
# Parts of the data dir no run may open, whatever their mode was (``close_data_dir``).
PRIVATE = ("creds", "secrets", "nats", "logs", "anchors")
PRIVATE_FILES = ("supervisor.log", "nats.log")
USERADD_TRIES = 20  # another process may hold /etc/passwd's lock (exit 1): try again for a few seconds


class RunAsError(Exception):
    """A run user cannot be had (no ``useradd``, a name taken by someone else); ``str()`` says what to do."""


@dataclass(frozen=True)
class RunUser:
    """The OS user a workspace's pods run as. ``uid`` -1 stands for "any other user" (no owner, no group)."""

    name: str
    uid: int
    gid: int

    @property
    def gids(self) -> tuple[int, ...]:
        return (self.gid,) if self.uid >= 0 else ()


OTHERS = RunUser("other users", -1, -1)


def user_name(workspace: str) -> str:
    """``tau-ws-<workspace>``; a name useradd would refuse (upper case, other characters) or one over 32
    characters is cleaned and cut, with a digest of the workspace name so two workspaces never share one."""
    clean = re.sub(r"[^a-z0-9-]+", "-", workspace.lower()).strip("-")
    name = PREFIX + clean
    if clean == workspace and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(workspace.encode()).hexdigest()[:8]
    head = clean[:MAX_NAME - len(PREFIX) - len(digest) - 1].rstrip("-")
    return f"{PREFIX}{head}-{digest}" if head else f"{PREFIX}{digest}"


class WorkspaceUsers:
    """The run user of each workspace, created on first use (root only). Thread-safe: the runtime's threads
    and the kubelet ask for the same workspace's user."""

    def __init__(self, *, useradd: str = "") -> None:
        self.useradd = useradd or shutil.which("useradd") or "/usr/sbin/useradd"
        self._known: dict[str, RunUser] = {}
        self._lock = threading.Lock()

    def user(self, workspace: str) -> RunUser:
        with self._lock:
            got = self._known.get(workspace)
            if got is None:
                got = self._known[workspace] = self._ensure(workspace)
            return got

    def _ensure(self, workspace: str) -> RunUser:
        name = user_name(workspace)
        for attempt in range(USERADD_TRIES):
            try:
                return _checked(pwd.getpwnam(name), workspace)
            except KeyError:
                pass
            try:
                done = subprocess.run([self.useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent",
                                       "--shell", "/usr/sbin/nologin", "--user-group", "--comment",
                                       COMMENT + workspace, name], capture_output=True, text=True, timeout=30,
                                      check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise RunAsError(f"cannot create the OS user {name} for workspace {workspace!r}'s runs: {exc}; "
                                 "install useradd (package passwd) or set TAU_RUN_AS=stack") from exc
            if done.returncode in (0, 9):  # 9: it exists (another process made it meanwhile)
                continue
            if done.returncode != 1 or attempt == USERADD_TRIES - 1:  # 1: /etc/passwd is locked by another
                raise RunAsError(f"cannot create the OS user {name} for workspace {workspace!r}'s runs: useradd "
                                 f"exited {done.returncode}: {done.stderr.strip()}")
            time.sleep(0.25)
        raise RunAsError(f"the OS user {name} was created but cannot be found (check /etc/nsswitch.conf)")


def _checked(entry: pwd.struct_passwd, workspace: str) -> RunUser:
    if entry.pw_uid == 0 or not entry.pw_gecos.startswith(COMMENT):
        raise RunAsError(f"the OS user {entry.pw_name} exists and was not created by taugrid (uid {entry.pw_uid}, "
                         f"comment {entry.pw_gecos!r}): workspace {workspace!r}'s runs will not run as it; rename "
                         "that user or the workspace")
    return RunUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


# ---------------------------------------------------------------- what a user may reach


def _allows(st: os.stat_result, user: RunUser, bit: int) -> bool:
    """``bit`` is 4 (read), 2 (write) or 1 (execute/search), as for "others"."""
    if user.uid == 0:
        return True
    if st.st_uid == user.uid:
        return bool((st.st_mode >> 6) & bit)
    if st.st_gid in user.gids:
        return bool((st.st_mode >> 3) & bit)
    return bool(st.st_mode & bit)


def _describe(path: Path, st: os.stat_result) -> str:
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return f"{path} is {stat.S_IMODE(st.st_mode):04o} (owner {owner})"


def cannot_reach(path: str | Path, user: RunUser, *, execute: bool = False) -> str:
    """Why ``user`` cannot open ``path`` (with ``execute``: run it): the first directory on the way that it may
    not search, or the file's own mode; "" when it can. Both the path as written and where its links lead are
    walked, as the kernel walks them."""
    given = Path(os.path.abspath(path))
    real = Path(os.path.realpath(given))
    try:
        for target in dict.fromkeys((given, real)):
            for d in reversed(target.parents):
                st = os.stat(d)
                if not _allows(st, user, 1):
                    return f"{_describe(d, st)}: {user.name} may not enter it"
        st = os.stat(real)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not _allows(st, user, 1 if execute else 4):
        return f"{_describe(real, st)}: {user.name} may not {'run' if execute else 'read'} it"
    return ""


# ---------------------------------------------------------------- giving files to a run


def give(path: Path, user: RunUser, *, mode: int = 0o700, recursive: bool = False) -> None:
    """``path`` (a directory whose parent only root may write) and, with ``recursive``, everything under it,
    owned by ``user``; ``path`` gets ``mode``. Never through a link: ``path`` itself is opened without following
    one, the tree is walked by file descriptors (``os.fwalk``) bottom-up, so no directory is the user's before
    everything in it is done, and a tree already the user's is not walked again (its owner may have put links
    anywhere in it since)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if recursive and os.fstat(fd).st_uid != user.uid:
            for _root, dirs, files, dir_fd in os.fwalk(".", topdown=False, dir_fd=fd):
                for name in [*dirs, *files]:
                    os.chown(name, user.uid, user.gid, dir_fd=dir_fd, follow_symlinks=False)
        os.fchown(fd, user.uid, user.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def share(path: Path, user: RunUser, *, mode: int = 0o710, files: int = 0o640) -> None:
    """``path`` (and what is under it) stays root's, but ``user``'s group may pass through it (0710: the way to
    what was given) or, with ``mode`` 0750, read it (a pod's config-map and secret volumes, which Kubernetes
    mounts read-only: the user can change nothing root writes into again). Only for trees root made."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if mode != 0o710:
            for _root, dirs, names, dir_fd in os.fwalk(".", topdown=False, dir_fd=fd):
                for name in dirs:
                    os.chown(name, -1, user.gid, dir_fd=dir_fd, follow_symlinks=False)
                    os.chmod(name, mode, dir_fd=dir_fd)
                for name in names:
                    if stat.S_ISREG(os.lstat(name, dir_fd=dir_fd).st_mode):
                        os.chown(name, -1, user.gid, dir_fd=dir_fd, follow_symlinks=False)
                        os.chmod(name, files, dir_fd=dir_fd)
        os.fchown(fd, -1, user.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def group_dir(path: Path, user: RunUser) -> None:
    """``path`` (and missing parents, 0711) root's, readable and passable by ``user``'s group only (0750): the
    user uses what root puts there and can change nothing in it itself."""
    fd = _open_dir(path, user, create=0o711)
    try:
        os.fchown(fd, 0, user.gid)
        os.fchmod(fd, 0o750)
    finally:
        os.close(fd)


def make_private_dirs(path: Path, user: RunUser) -> None:
    """Create ``path`` and its missing parents: the parents traverse-only (0711, nobody may list them), ``path``
    itself (new or not) given to ``user`` (0700), so other workspaces' runs can neither list nor open it. The
    path is walked from ``/`` one name at a time and a link in a directory ``user`` may write is never followed
    (an earlier run of the workspace could have put one where its next attempt's checkpoints go)."""
    fd = _open_dir(path, user, create=0o711)
    try:
        os.fchown(fd, user.uid, user.gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _writable_by(st: os.stat_result, user: RunUser) -> bool:
    if st.st_uid == user.uid:
        return True
    if st.st_gid in user.gids and st.st_mode & stat.S_IWGRP:
        return True
    return bool(st.st_mode & stat.S_IWOTH)


def _open_dir(path: Path, user: RunUser, *, create: int) -> int:
    """A descriptor of directory ``path``, reached one name at a time; missing ones are made with ``create``."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in Path(os.path.abspath(path)).parts[1:]:
            flags = os.O_RDONLY | os.O_DIRECTORY
            if _writable_by(os.fstat(fd), user):
                flags |= os.O_NOFOLLOW
            try:
                nxt = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                made = True
                try:
                    os.mkdir(name, create, dir_fd=fd)
                except FileExistsError:
                    made = False
                nxt = os.open(name, flags | os.O_NOFOLLOW, dir_fd=fd)
                if made:
                    os.fchmod(nxt, create)  # the umask took bits away
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(exc.errno, f"{name} in {path} is a link or not a directory, where {user.name} "
                                             "may write: not followed") from exc
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def close_data_dir(data_dir: Path) -> None:
    """The data dir as per-workspace run users must find it: traverse-only itself (0711: a run reaches its own
    pod directory, its environment and its outputs by their names), and ``creds``, ``secrets``, ``nats`` (the
    bus's store), ``logs`` and ``anchors`` 0700, the supervisor's and the server's logs 0600."""
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o711)
    for name in PRIVATE:
        path = data_dir / name
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    for name in PRIVATE_FILES:
        path = data_dir / name
        if path.exists():
            os.chmod(path, 0o600)


# ---------------------------------------------------------------- the mode


@dataclass(frozen=True)
class Decision:
    """``mode`` is WORKSPACE or STACK; ``why`` says why runs run as the stack's user ("" in workspace mode);
    ``refused`` is set when TAU_RUN_AS=workspace was asked for and cannot be had; ``note``, in workspace mode,
    which interpreter runs fall back to when the first choice is out of the workspace users' reach."""

    mode: str
    why: str = ""
    refused: str = ""
    note: str = ""


def decide(data_dir: Path, *, environ: Mapping[str, str] | None = None, python: str = "") -> Decision:
    """The mode for a stack in ``data_dir`` (see the module's docstring). ``python``: the one interpreter runs
    fall back to (default: ``TAU_LOCAL_PYTHON``, then ``ownenv.clean_pythons``, the first another user may run)."""
    given = settings.of(environ).local
    asked = given.run_as
    if asked not in ("", WORKSPACE, STACK):
        return Decision(STACK, refused=f"{ENV}={asked!r} is not one of {WORKSPACE}, {STACK}")
    if asked == STACK:
        return Decision(STACK, why=f"{ENV}=stack")
    impossible = _impossible()
    if impossible:
        refused = f"{ENV}=workspace cannot be had: {impossible}" if asked == WORKSPACE else ""
        return Decision(STACK, why=impossible, refused=refused)
    pin = given.python
    candidates = (python,) if python else tuple(dict.fromkeys(p for p in (pin, *clean_pythons()) if p))
    unreachable, note = _unreachable(data_dir, candidates)
    if unreachable and asked != WORKSPACE:
        return Decision(STACK, why="; ".join(unreachable))
    return Decision(WORKSPACE, note=note)


def _impossible() -> str:
    if os.geteuid() != 0:
        return f"the stack runs as {_me()}, not root, so it cannot start runs as other OS users"
    if not (shutil.which("useradd") or os.path.exists("/usr/sbin/useradd")):
        return "useradd is not installed, so no OS user can be made for a workspace's runs"
    return ""


def _unreachable(data_dir: Path, pythons: tuple[str, ...]) -> tuple[list[str], str]:
    """(why another OS user cannot reach the data dir or any of ``pythons``, a note when only a later one of
    ``pythons`` is in its reach)."""
    problems: list[str] = []
    data = cannot_reach(data_dir, OTHERS, execute=True)
    if data:
        problems.append(f"another OS user cannot reach the data dir {data_dir} ({data}); use a data dir under a "
                        "folder every user may enter, e.g. TAU_DATA_DIR=/var/lib/taugrid (root's default)")
    python, skipped = runnable(pythons, OTHERS)
    if not python:
        problems.append(f"another OS user cannot run any interpreter runs may fall back to ({'; '.join(skipped)}); "
                        "set TAU_LOCAL_PYTHON to one every user may run, e.g. /usr/bin/python3")
    note = (f"runs that bring no interpreter their workspace's OS user may run use {python} ({'; '.join(skipped)})"
            if python and skipped else "")
    return problems, note


def runnable(pythons: Iterable[str], user: RunUser) -> tuple[str, list[str]]:
    """The first of ``pythons`` that ``user`` may run ("" for none), and why each one before it may not."""
    skipped: list[str] = []
    for python in pythons:
        problem = cannot_reach(python, user, execute=True)
        if not problem:
            return python, skipped
        skipped.append(problem if problem.startswith(f"{python}:") else f"{python}: {problem}")
    return "", skipped


def _me() -> str:
    try:
        return getpass.getuser()
    except OSError:
        return f"uid {os.geteuid()}"


def from_env(data_dir: Path, environ: Mapping[str, str] | None = None) -> WorkspaceUsers | None:
    """The run users for the local cluster: per-workspace users when ``TAU_RUN_AS`` (as the supervisor resolved
    it, or by :func:`decide`) says ``workspace``, else None (pods run as the stack's user)."""
    mode = settings.of(environ).local.run_as or decide(data_dir, environ=environ).mode
    return WorkspaceUsers() if mode == WORKSPACE and os.geteuid() == 0 else None
