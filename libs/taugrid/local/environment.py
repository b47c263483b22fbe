"""The Python a local pod runs with: the researcher's interpreter, or a per-run environment built with uv.

``requirements(work, pip)`` reads what a project asks for (``runtime.pip``, ``requirements.txt``,
``pyproject.toml``'s ``[project].dependencies``); ``EnvironmentBuilder.prepare`` returns the interpreter to run:
the base interpreter itself when nothing is asked for, else ``<root>/<hash>/bin/python`` of a virtualenv built
with ``uv venv`` + ``uv pip install`` on top of that base. ``isolated`` (a base the researcher did not choose,
``ownenv.CLEAN_BASE``) always makes a virtualenv, empty when nothing is asked for, and never layers the base's
packages under it. Pure of the bus; ``prepare`` blocks (run it in a thread).

Invariants:
  * The cache key is the base interpreter's path and version plus the requirement texts; a second run with
    the same key reuses ``<root>/<hash>/`` without running the installer.
  * ``<root>/<hash>/`` is complete or absent: it is built in ``<root>/.tmp-<hash>-<random>/`` and renamed into
    place; a file lock keeps concurrent builds of one hash from duplicating work, and a lost rename race
    discards the loser's copy. A failed build leaves nothing behind.
  * Files a requirement points at (``./wheels/x.whl``, ``-e .``) resolve against the project directory, but their
    content is not part of the key: change the requirement text to force a rebuild.
  * With a ``user`` (a workspace's OS user, ``taugrid.local.runas``), everything that runs code the researcher
    chose runs as that user: the interpreter's probes and both ``uv`` steps (an sdist or a local project's build
    backend runs during the install). Its environments live in a folder of its own, root's but readable by the
    user's group only (0750: the user can neither plant nor swap anything there), with the user's own home and
    uv cache in ``.home``; each build's folder is the user's once the requirement list is in it, and root writes
    nothing into it after that (later files are written by the environment's interpreter as the user). A ``uv``
    the user may not run (taugrid installed under root's 0700 home, by ``uv tool install`` or ``pipx``) is
    copied once into ``.bin/`` there (root's, 0755) and run from that copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taugrid.local import runas
from taugrid.local.runas import RunUser

REQUIREMENTS_FILE = "requirements.txt"
PYPROJECT_FILE = "pyproject.toml"
TAIL_LINES = 12
log = logging.getLogger("taugrid.local.environment")

VERSION_TIMEOUT_S = 20.0
# A probe that times out is tried again with longer limits before the interpreter is called broken: on a machine
# loaded to a load average of ~18, a pyenv shim's `python3 -c` once took over 20 s, and calling that a
# configuration error failed a run for good.
VERSION_TIMEOUTS_S = (VERSION_TIMEOUT_S, 3 * VERSION_TIMEOUT_S)
BUILD_TIMEOUT_S = 1800.0
META_FILE = "tau-env.json"
HINT = ("fix the requirement named above in runtime.pip, requirements.txt or pyproject.toml "
        "(a private index: set UV_INDEX_URL before `tau up`; offline: pre-fill uv's cache and set UV_OFFLINE=1)")

Progress = Callable[[str], None]


class EnvironmentFailed(Exception):
    """The environment could not be prepared; ``str()`` is the reason, ``tail`` the installer's last lines."""

    def __init__(self, reason: str, *, tail: list[str] | None = None, hint: str = HINT) -> None:
        self.reason, self.tail, self.hint = reason, tail or [], hint
        super().__init__(reason)

    @property
    def message(self) -> str:
        """One message for a run's failure: the reason, the installer's last lines, the hint."""
        lines = [self.reason, *(f"  {line}" for line in self.tail)]
        return "\n".join([*lines, f"hint: {self.hint}"] if self.hint else lines)


@dataclass(frozen=True)
class Requirements:
    """What a project asks to have installed, as texts (they make the cache key)."""

    pip: tuple[str, ...] = ()
    requirements_txt: str = ""
    pyproject: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.pip or self.requirements_txt.strip() or self.pyproject)

    def describe(self) -> str:
        parts = []
        if self.pip:
            parts.append(f"runtime.pip ({len(self.pip)})")
        if self.requirements_txt.strip():
            parts.append(REQUIREMENTS_FILE)
        if self.pyproject:
            parts.append(f"{PYPROJECT_FILE} ({len(self.pyproject)})")
        return " + ".join(parts)


def requirements(work: Path, pip: list[str] | tuple[str, ...] = (), *, user: RunUser | None = None) -> Requirements:
    """What the project in ``work`` asks for. A malformed ``pyproject.toml`` is an error that names the file.
    With ``user`` (the project is that user's) a file is read only if it is that user's own regular file, never
    through a link: this process is root, and a link or a hard link could point at any file."""
    text = _project_file(work / REQUIREMENTS_FILE, user)
    deps: tuple[str, ...] = ()
    pyproject_text = _project_file(work / PYPROJECT_FILE, user)
    if pyproject_text:
        try:
            project = tomllib.loads(pyproject_text).get("project") or {}
        except tomllib.TOMLDecodeError as exc:
            raise EnvironmentFailed(f"{PYPROJECT_FILE} is not valid TOML: {exc}",
                                    hint=f"fix {PYPROJECT_FILE}, or remove it from the project") from exc
        raw = project.get("dependencies") or []
        if not isinstance(raw, list) or not all(isinstance(d, str) for d in raw):
            raise EnvironmentFailed(f"{PYPROJECT_FILE}: [project].dependencies must be a list of strings",
                                    hint='write dependencies = ["six>=1.16"]')
        deps = tuple(raw)
    return Requirements(pip=tuple(pip), requirements_txt=text, pyproject=deps)


def _project_file(path: Path, user: RunUser | None) -> str:
    if user is None:
        return path.read_text() if path.is_file() else ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise EnvironmentFailed(f"{path.name} cannot be read: {exc.strerror or exc} (a link is not followed)",
                                hint=f"make {path.name} a plain file of the project") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != user.uid or st.st_nlink != 1:
            raise EnvironmentFailed(f"{path.name} is not a plain file of the run's own",
                                    hint=f"make {path.name} a plain file of the project")
        return fh.read().decode(errors="replace")


@dataclass(frozen=True)
class Prepared:
    """The interpreter a pod runs with, and how it came to be."""

    python: str
    version: str
    base: str  # the interpreter the environment is built on (== python without requirements)
    env_hash: str = ""  # "" when no environment was needed
    cached: bool = False  # the environment existed already: no installer ran

    def describe(self) -> dict[str, str]:
        out = {"python": self.python, "python_version": self.version}
        if self.env_hash:
            out.update(base_python=self.base, env=self.env_hash, env_cached=str(self.cached).lower())
        return out


@dataclass
class EnvironmentBuilder:
    """Builds and caches per-run environments under ``root`` (``$TAU_DATA_DIR/envs``, or
    ``envs/<user>`` for a workspace's OS user) with ``uv``."""

    root: Path
    uv: str = ""
    user: RunUser | None = None
    _versions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.user is None:
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            runas.group_dir(self.root, self.user)
            (self.root / ".home").mkdir(exist_ok=True)
            runas.give(self.root / ".home", self.user)
        self.uv = self.uv or find_uv()
        if self.user is not None:
            self.uv = _uv_for(self.uv, self.user, self.root / ".bin")

    # ---------------------------------------------------------------- the interpreter
    def version(self, python: str) -> str:
        """``3.12.3`` for an interpreter that runs; EnvironmentFailed names the path otherwise."""
        if python in self._versions:
            return self._versions[python]
        out = _probe(python, "import sys; print('%d.%d.%d' % sys.version_info[:3])", user=self.user)
        if out.returncode != 0:
            raise EnvironmentFailed(f"interpreter {python} exited {out.returncode}",
                                    tail=_tail(out.stderr),
                                    hint="set TAU_PYTHON to a working interpreter before `tau run`")
        self._versions[python] = out.stdout.strip()
        return self._versions[python]

    # ---------------------------------------------------------------- the environment
    def key(self, base: str, version: str, reqs: Requirements, *, isolated: bool = False) -> str:
        fields: dict[str, object] = {"python": base, "version": version, "pip": list(reqs.pip),
                                     "requirements.txt": reqs.requirements_txt, "pyproject": list(reqs.pyproject),
                                     "platform": sys.platform}
        if isolated:  # only then, so the environments built before ``isolated`` existed keep their keys
            fields["isolated"] = True
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]

    def cached(self, base: str, reqs: Requirements, *, isolated: bool = False) -> Path | None:
        """The ready environment for these requirements, or None (cheap: no installer, one version probe)."""
        env = self.root / self.key(base, self.version(base), reqs, isolated=isolated)
        return env if _python_of(env).exists() else None

    def prepare(self, *, base: str, reqs: Requirements, project: Path, progress: Progress | None = None,
                isolated: bool = False) -> Prepared:
        """The interpreter for a pod: ``base`` itself, or the cached/built environment for ``reqs`` (always an
        environment when ``isolated``: see the module docstring)."""
        say = progress or (lambda _msg: None)
        version = self.version(base)
        if reqs.empty and not isolated:
            return Prepared(python=base, version=version, base=base)
        digest = self.key(base, version, reqs, isolated=isolated)
        final = self.root / digest
        if _python_of(final).exists():
            return Prepared(python=str(_python_of(final)), version=version, base=base, env_hash=digest,
                            cached=True)
        with _locked(self.root / f".{digest}.lock",
                     on_wait=lambda: say(f"waiting for another build of environment {digest}")):
            if _python_of(final).exists():  # another builder finished while we waited
                return Prepared(python=str(_python_of(final)), version=version, base=base, env_hash=digest,
                                cached=True)
            self._build(final, base=base, version=version, reqs=reqs, project=project, say=say,
                        isolated=isolated)
        return Prepared(python=str(_python_of(final)), version=version, base=base, env_hash=digest)

    def _build(self, final: Path, *, base: str, version: str, reqs: Requirements, project: Path,
               say: Progress, isolated: bool = False) -> None:
        if not self.uv:
            raise EnvironmentFailed("the installer `uv` is not available to the local cluster",
                                    hint="install taugrid with its dependencies (uv ships with it)")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=self.root))
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would keep out the OS users pods may run as (``runas``)
        try:
            args = ["pip", "install", "--python", str(_python_of(tmp))]
            spec_dir = tmp / ".tau-requirements"  # written before the user has the folder (see the docstring)
            spec_dir.mkdir()
            if reqs.requirements_txt.strip():
                # Installed from the project's own file, so its relative paths resolve against the project.
                args += ["-r", str(project / REQUIREMENTS_FILE)]
            listed = [*reqs.pip, *reqs.pyproject]
            if listed:
                extra = spec_dir / "listed.txt"
                extra.write_text("\n".join(listed) + "\n")
                args += ["-r", str(extra)]
            if self.user is not None:
                os.chown(tmp, self.user.uid, self.user.gid)
            say(f"creating a virtualenv on Python {version} ({base})")
            self._uv(["venv", "--quiet", "--relocatable", "--allow-existing", "--python", base, str(tmp)],
                     cwd=project, say=say, what="uv venv")
            if not reqs.empty:
                say(f"installing {reqs.describe()} with uv")
                self._uv(args, cwd=project, say=say, what="uv pip install")
            if not isolated:
                self._layer_over(base, tmp)
            self._write(tmp / META_FILE, json.dumps({
                "base": base, "version": version, "pip": list(reqs.pip), "pyproject": list(reqs.pyproject),
                "requirements.txt": reqs.requirements_txt, "isolated": isolated, "built": time.time()}, indent=1),
                python=tmp)
            try:
                tmp.rename(final)
            except OSError:
                if not _python_of(final).exists():
                    raise
                # Lost a race with a builder outside our lock (another machine sharing the dir): theirs stands.
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say("environment ready")

    def _layer_over(self, base: str, env: Path) -> None:
        """When ``base`` lives in a virtualenv or conda env, its packages stay importable underneath the
        requirements: a ``.pth`` appends its site-packages after the new environment's own."""
        probe = ("import json, sys, sysconfig; p = sysconfig.get_paths(); "
                 "print(json.dumps([p['purelib'], p['platlib']] if sys.prefix != sys.base_prefix else []))")
        out = _probe(base, probe, user=self.user)
        try:
            paths = list(dict.fromkeys(json.loads(out.stdout))) if out.returncode == 0 else []
        except ValueError:
            paths = []
        site = next(iter(env.glob("lib/python*/site-packages")), None)
        if paths and site is not None:
            self._write(site / "_tau_base_env.pth", "\n".join(paths) + "\n", python=env)

    def _write(self, path: Path, text: str, *, python: Path) -> None:
        """Write a file into the environment being built: as its user, by its own interpreter, when it has one
        (root writing into the user's folder could be led anywhere by a link the user left)."""
        if self.user is None:
            path.write_text(text)
            return
        code = "import sys; open(sys.argv[1], 'x').write(sys.argv[2])"
        done = subprocess.run([str(_python_of(python)), "-c", code, str(path), text], capture_output=True,
                              text=True, timeout=VERSION_TIMEOUT_S, check=False, **_as(self.user))
        if done.returncode != 0:
            raise EnvironmentFailed(f"writing {path.name} into the environment failed", tail=_tail(done.stderr))

    def _uv(self, args: list[str], *, cwd: Path, say: Progress, what: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}  # never the cluster's own venv
        env.update(UV_NO_PROGRESS="1", NO_COLOR="1")
        if self.user is not None:  # the user's own home and cache: nothing of root's is read or written
            home = self.root / ".home"
            env.update(HOME=str(home), UV_CACHE_DIR=str(home / ".cache" / "uv"), USER=self.user.name,
                       LOGNAME=self.user.name)
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        try:
            proc = subprocess.Popen([self.uv, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                    **_as(self.user))
        except OSError as exc:
            raise EnvironmentFailed(f"{what} could not start: {exc}") from exc
        assert proc.stdout is not None
        started = time.monotonic()
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                tail.append(line)
                say(line)
            if time.monotonic() - started > BUILD_TIMEOUT_S:
                proc.kill()
                raise EnvironmentFailed(f"{what} took longer than {BUILD_TIMEOUT_S:.0f}s", tail=list(tail))
        code = proc.wait()
        if code != 0:
            raise EnvironmentFailed(f"{what} failed (exit code {code})", tail=list(tail))


def find_uv() -> str:
    """The ``uv`` binary: the one installed with taugrid (the ``uv`` wheel), else one on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv") or ""


def _uv_for(uv: str, user: RunUser, tools: Path) -> str:
    """``uv`` when ``user`` may run it, else a copy in ``tools`` (made again when ``uv`` changes) that it may."""
    if not uv or not runas.cannot_reach(uv, user, execute=True):
        return uv
    copy, src = tools / "uv", os.stat(uv)
    with contextlib.suppress(FileNotFoundError):
        have = os.stat(copy)
        if (have.st_size, have.st_mtime_ns) == (src.st_size, src.st_mtime_ns):
            return str(copy)
    tools.mkdir(mode=0o755, exist_ok=True)
    os.chmod(tools, 0o755)
    with tempfile.NamedTemporaryFile(dir=tools, prefix=".uv-", delete=False) as tmp:
        pass
    try:
        shutil.copy2(uv, tmp.name)
        os.chmod(tmp.name, 0o755)
        os.replace(tmp.name, copy)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp.name)
        raise
    log.info("%s may not run %s; its environments are built with a copy, %s", user.name, uv, copy)
    return str(copy)


def _python_of(env: Path) -> Path:
    return env / "bin" / "python"


def _tail(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-TAIL_LINES:]


@contextlib.contextmanager
def _locked(path: Path, *, on_wait: Callable[[], None]) -> Iterator[None]:
    # never through a link, nor blocked on a FIFO: the folder may be a workspace user's
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _as(user: RunUser | None) -> dict[str, Any]:
    """``subprocess`` arguments that run a command as ``user`` with its own group only (none: as this process)."""
    return {"user": user.uid, "group": user.gid, "extra_groups": []} if user is not None else {}


def _probe(python: str, code: str, *, user: RunUser | None = None) -> subprocess.CompletedProcess[str]:
    """``python -c code`` (as ``user``), its timeout retried with a longer limit (VERSION_TIMEOUTS_S);
    EnvironmentFailed when the interpreter cannot be started or never answers."""
    for i, limit in enumerate(VERSION_TIMEOUTS_S):
        try:
            return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=limit, check=False,
                                  **_as(user))
        except subprocess.TimeoutExpired as exc:
            if i + 1 == len(VERSION_TIMEOUTS_S):
                raise EnvironmentFailed(f"interpreter {python} did not answer within {limit:.0f} s: {exc}",
                                        hint="set TAU_PYTHON to a working interpreter before `tau run`") from exc
            log.warning("interpreter %s did not answer within %.0f s; trying again with %.0f s", python, limit,
                        VERSION_TIMEOUTS_S[i + 1])
        except OSError as exc:
            raise EnvironmentFailed(f"interpreter {python} does not run: {exc}",
                                    hint="set TAU_PYTHON to a working interpreter before `tau run`") from exc
    raise AssertionError("unreachable: the last timeout raises")

