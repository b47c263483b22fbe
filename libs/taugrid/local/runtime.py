"""What a local pod runs with, prepared off the control loop: the interpreter, its environment, or a container.

The controller calls ``begin(pod, work=…, request=…)`` once the pod's work directory holds the project, then
``poll(pod)`` on each tick: ``Preparing`` (a progress message), ``Ready`` (the interpreter, what to report, and
the container to run in, if any) or ``Failed`` (reason and message). Preparation runs in a thread, because
building an environment blocks for seconds to minutes; the control loop never waits for it. After a restart the
controller simply begins again: a finished environment is a cache hit, an interrupted one is rebuilt.

Once per source and machine: a pod whose project is a submitted snapshot (``source``, its content address) is
ready at ``begin`` when a pod of the same snapshot, request and OS user was made ready before in this process and
its interpreter is still there: the project's requirement files, and so the interpreter and environment chosen,
are a function of those alone. No thread, no version probe, no requirement files read again, and the controller
launches the pod on the same tick instead of the next one.

Which interpreter, in order: the run's explicit pin (``TAU_PYTHON`` when it ran ``tau run``), the machine's pin
(``TAU_LOCAL_PYTHON`` when ``tau up`` ran), the interpreter the submission recorded (project ``.venv``,
``VIRTUAL_ENV``, ``CONDA_PREFIX`` or ``python3`` on ``PATH``), else the interpreter the local cluster's virtualenv
was made from (``ownenv.base_python``: never taugrid's own packages). An interpreter the researcher did not choose
(the submission recorded ``ownenv.CLEAN_BASE``: taugrid's own environment was active and passed over) is only a
base: the run gets a virtualenv of its own on it, or on the fallback the OS user falls back to (empty, or holding
the project's requirements), so the packages installed into that interpreter (a pyenv build's, the
distribution's) are not importable unasked either.

When the pod runs as its workspace's OS user (``taugrid.local.runas``), that user must be able to run the
interpreter. The fallback is then the first of ``fallback`` and ``spares`` (``ownenv.clean_pythons``: the system's
``python3``) that the user may run, e.g. ``/usr/bin/python3`` where taugrid's own Python sits under root's 0700
home; an interpreter the submission recorded or pinned (``TAU_PYTHON``, ``TAU_LOCAL_PYTHON``) that the user
cannot run falls back to it, with a warning that names the interpreter, the directory that keeps the user out and
the one used instead (shown by ``tau run``, ``tau status`` and the run's evidence). Only when the user can run
none of them does the pod fail (EnvironmentFailed), naming each.

``runtime.image`` runs the pod in a container when a container engine answers (``docker info`` / ``podman info``,
probed once per process): ``Ready.engine`` names it and the kubelet runs the pod's containers through it
(``taugrid.local.containers``); otherwise the run goes ahead on the host interpreter with a warning saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from taugrid import settings
from taugrid.local.environment import EnvironmentBuilder, EnvironmentFailed, requirements
from taugrid.local.ownenv import CLEAN_BASE, base_python, clean_pythons
from taugrid.local.runas import RunUser, cannot_reach, runnable
from taugrid.settings.model import DEFAULT_ENGINES

ENGINES = DEFAULT_ENGINES
ENGINES_ENV = "TAU_CONTAINER_ENGINES"  # comma-separated, tried in order; empty = never run pods in containers
ENGINE_PROBE_TIMEOUT_S = 10.0
READY_KEPT = 256  # prepared runtimes kept by snapshot, request and user (a few bytes each)


@dataclass(frozen=True)
class RuntimeRequest:
    """What the submission asked for (``BackendApply``'s python, python_source, pip, image)."""

    python: str = ""
    python_source: str = ""
    pip: tuple[str, ...] = ()
    image: str = ""


@dataclass(frozen=True)
class Preparing:
    message: str


@dataclass(frozen=True)
class Ready:
    python: str
    environment: dict[str, str]  # reported as ExecRunning.environment (pod annotations)
    engine: str = ""  # docker | podman when the pod runs in ``image``
    image: str = ""
    warning: str = ""
    progress: str = ""  # the last ``Preparing`` message of the preparation that made it ("": none, e.g. a cache hit)


@dataclass(frozen=True)
class Failed:
    reason: str
    message: str
    progress: str = ""  # as ``Ready.progress``: what it was doing when it failed


Outcome = Preparing | Ready | Failed


def choose_python(request: RuntimeRequest, *, machine_pin: str, fallback: str) -> tuple[str, str, str]:
    """(interpreter, where it came from, a warning or "")."""
    if request.python and request.python_source == "TAU_PYTHON":
        return request.python, "TAU_PYTHON", ""
    if machine_pin:
        return machine_pin, "TAU_LOCAL_PYTHON", ""
    if request.python and os.access(request.python, os.X_OK):
        return request.python, request.python_source or "submission", ""
    if request.python:
        return fallback, "local cluster", (f"the submitting interpreter {request.python} is not on this machine; "
                                           f"the run uses {fallback}")
    return fallback, "local cluster", ""


@dataclass
class _Job:
    message: str = ""  # "" until there is something worth saying (a quick preparation says nothing)
    outcome: Ready | Failed | None = None


@dataclass
class PodRuntimes:
    """Prepares pods' runtimes in threads; ``data_dir/envs`` caches built environments."""

    data_dir: Path
    machine_pin: str = field(default_factory=lambda: settings.current().local.python)
    fallback: str = field(default_factory=base_python)  # never taugrid's own venv (``ownenv``)
    spares: tuple[str, ...] = field(default_factory=clean_pythons)  # for users who cannot run ``fallback``
    engines: tuple[str, ...] = field(default_factory=lambda: settings.current().local.container_engines)
    _jobs: dict[str, _Job] = field(default_factory=dict)
    _ready: dict[tuple[str, RuntimeRequest, int], Ready] = field(default_factory=dict)  # see the module docstring
    _engine: str | None = None
    _engine_probed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.builder = EnvironmentBuilder(self.data_dir / "envs")
        self._builders: dict[int, EnvironmentBuilder] = {}  # a workspace user's own, by uid

    def builder_for(self, user: RunUser | None) -> EnvironmentBuilder:
        """The stack's builder, or ``user``'s (``envs/<user>``: its builds run as it, never shared with another
        workspace, whose user could otherwise have changed an environment this one then runs)."""
        if user is None:
            return self.builder
        with self._lock:
            if user.uid not in self._builders:
                self._builders[user.uid] = EnvironmentBuilder(self.data_dir / "envs" / user.name, user=user)
            return self._builders[user.uid]

    def begin(self, pod: str, *, work: Path, request: RuntimeRequest, user: RunUser | None = None,
              source: str = "") -> None:
        """Start preparing ``pod`` (once; a second call for the same pod does nothing). ``user``: the OS user
        the pod will run as, when not the stack's own. ``source``: the content address of the snapshot in
        ``work`` ("" when it is not one): a snapshot made ready before is ready at once."""
        if pod in self._jobs:
            return
        job = self._jobs[pod] = _Job()
        key = (source, request, user.uid if user is not None else -1)
        known = self._ready.get(key) if source else None
        if known is not None and (known.engine or os.access(known.python, os.X_OK)):  # still there
            job.outcome = known
            return
        threading.Thread(target=self._prepare, args=(job, work, request, user, key if source else None),
                         name=f"runtime-{pod}", daemon=True).start()

    def poll(self, pod: str) -> Outcome | None:
        """None for a pod never begun (e.g. after a restart: begin it again). ``Preparing("")`` means busy
        with nothing to report yet."""
        job = self._jobs.get(pod)
        if job is None:
            return None
        if job.outcome is None:
            return Preparing(job.message)
        return replace(job.outcome, progress=job.message) if job.message else job.outcome

    def forget(self, pod: str) -> None:
        self._jobs.pop(pod, None)

    def engine(self) -> str:
        """The first container engine whose ``info`` succeeds ("" for none); probed once per process."""
        with self._lock:
            if not self._engine_probed:
                self._engine = next((e for e in self.engines if _engine_answers(e)), "")
                self._engine_probed = True
            return self._engine or ""

    def fallback_for(self, user: RunUser | None) -> str:
        """The interpreter ``user``'s runs fall back to: ``fallback`` if the user may run it, else the first of
        ``spares`` it may (``fallback`` again when none: the pod then fails, naming why)."""
        if user is None:
            return self.fallback
        return runnable(dict.fromkeys((self.fallback, *self.spares)), user)[0] or self.fallback

    def _remember(self, key: tuple[str, RuntimeRequest, int] | None, ready: Ready) -> None:
        """Keep ``ready`` for the next pod of the same snapshot (its environment now exists: a cache hit)."""
        if key is None:
            return
        if ready.environment.get("env_cached") == "false":
            ready = replace(ready, environment={**ready.environment, "env_cached": "true"})
        with self._lock:
            if len(self._ready) >= READY_KEPT:
                self._ready.pop(next(iter(self._ready)))  # the oldest first
            self._ready[key] = ready

    def _prepare(self, job: _Job, work: Path, request: RuntimeRequest, user: RunUser | None = None,
                 key: tuple[str, RuntimeRequest, int] | None = None) -> None:
        fallback = self.fallback_for(user)
        python, source, warning = choose_python(request, machine_pin=self.machine_pin, fallback=fallback)
        # A base nobody chose (taugrid's own environment was passed over) and no operator's pin: whichever
        # interpreter is used is only the base of a virtualenv of the run's own, said once by ``tau run``.
        clean = request.python_source == CLEAN_BASE and source != "TAU_LOCAL_PYTHON"

        def say(message: str) -> None:
            job.message = message

        try:
            if user is not None and not (request.image and self.engine()):
                python, source, warning = self._runnable(python, source, warning, user, fallback)
            if clean:  # any base the user may run will do: nothing to warn about
                source, warning = CLEAN_BASE, ""
            if request.image:
                engine = self.engine()
                if engine:
                    job.outcome = Ready(python="python", engine=engine, image=request.image,
                                        environment={"container": request.image, "engine": engine})
                    self._remember(key, job.outcome)
                    return
                why = (f"no container engine answered ({', '.join(f'`{e} info`' for e in self.engines)} failed)"
                       if self.engines else f"container engines are switched off ({ENGINES_ENV} is empty)")
                warning = f"runtime.image {request.image!r} is ignored locally: {why}; the run uses {python}"
                say(warning)
            reqs = requirements(work, request.pip, user=user)
            builder = self.builder_for(user)
            if (clean or not reqs.empty) and builder.cached(python, reqs, isolated=clean) is None:  # a hit: silent
                say(f"preparing a Python environment for {reqs.describe()}" if not reqs.empty else
                    "preparing a clean Python environment (the project asks for no packages)")
            got = builder.prepare(base=python, reqs=reqs, project=work, progress=say, isolated=clean)
        except EnvironmentFailed as err:
            job.outcome = Failed("EnvironmentFailed", err.message)
            return
        except Exception as exc:  # noqa: BLE001 - a failed preparation fails its pod, never the cluster
            job.outcome = Failed("EnvironmentFailed", f"preparing the environment failed: {exc!r}")
            return
        if user is not None and got.python != python:
            problem = cannot_reach(got.python, user, execute=True)
            if problem:
                job.outcome = Failed("EnvironmentFailed", f"the environment's interpreter {got.python} cannot be run "
                                     f"by {user.name}, the OS user of this workspace's runs: {problem}")
                return
        environment = {**got.describe(), "source": source}
        if warning:
            environment["warning"] = warning
        job.outcome = Ready(python=got.python, environment=environment, warning=warning)
        self._remember(key, job.outcome)


    def _runnable(self, python: str, source: str, warning: str, user: RunUser,
                  fallback: str) -> tuple[str, str, str]:
        """(interpreter, source, warning) that ``user`` can run: ``python``, else ``fallback`` with a warning
        saying why; EnvironmentFailed when the user can run neither."""
        problem = cannot_reach(python, user, execute=True)
        if not problem:
            return python, source, warning
        if python != fallback and not cannot_reach(fallback, user, execute=True):
            which = {"TAU_PYTHON": "the interpreter TAU_PYTHON pins", "TAU_LOCAL_PYTHON":
                     "the interpreter TAU_LOCAL_PYTHON pins"}.get(source, "the submitting interpreter")
            return fallback, "local cluster", (f"{which} {python} cannot be run by {user.name} ({problem}); the run "
                                               f"uses {fallback}")
        tried = "; ".join(runnable(dict.fromkeys((python, fallback, *self.spares)), user)[1])
        raise EnvironmentFailed(
            f"no interpreter can be run by {user.name}, the OS user of this workspace's runs: {tried}",
            hint="set TAU_PYTHON (before `tau run`) or TAU_LOCAL_PYTHON (before `tau up`) to an interpreter every "
                 "user may run, e.g. /usr/bin/python3")


def _engine_answers(engine: str) -> bool:
    path = shutil.which(engine)
    if not path:
        return False
    try:
        return subprocess.run([path, "info"], capture_output=True, timeout=ENGINE_PROBE_TIMEOUT_S,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
