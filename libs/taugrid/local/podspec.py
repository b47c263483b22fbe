"""A Kubernetes Pod manifest turned into what the pod shim runs on this host. Pure: no processes, no bus.

What a kubelet and a container runtime would do before starting a container, done here for host processes:
- ``env``: literal values, ``valueFrom`` (``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``, ``resourceFieldRef``)
  and ``envFrom``; ``$(VAR)`` references expanded exactly as the kubelet expands them (:func:`expand`);
- ``command``/``args`` expanded against the container's env;
- volumes as host directories: ``emptyDir`` under the pod's directory, ``persistentVolumeClaim`` under a claims
  directory shared by all pods (``<claims>/<namespace>/<claimName>``), ``hostPath`` as itself, ``configMap``
  volumes as files, ``secret`` volumes as files (0600) in memory, under ``/dev/shm`` as the kubelet's tmpfs
  (:func:`secret_volumes_dir`), never on disk. A container that writes to its ``mountPath`` must write into the
  host directory, so every mount's path is rewritten where it appears as a path in ``workingDir``, ``command``,
  ``args`` and env values (``/data/x``, ``--out=/data/x``, ``sh -c 'ls /data'``), not inside files or programs.
  ``emptyDir`` at ``/dev/shm`` is the host's own. ``terminationMessagePath`` becomes
  ``<pod>/termination/<container>`` the same way.
- the image is ignored: the pod's ``work/`` directory stands in for the image's working directory (an absolute
  ``workingDir`` outside every volume is ``work/``; a relative one resolves under it); with the
  ``taugrid.io/container-engine`` annotation each command becomes ``<engine> run … <image> <command>`` with those
  directories mounted (``taugrid.local.containers``).

Anything the host cannot honour is refused with :class:`PodSpecError` (reason ``CreateContainerConfigError``
for missing config, as the kubelet reports it, else ``CreateContainerError``), naming the field.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taugrid.core.quantity import parse_cpu, parse_memory
from taugrid.local import containers
from taugrid.local.containers import ENGINE_ANNOTATION

# (namespace, name) -> the object's data, or None when it does not exist.
Resolver = Callable[[str, str], Mapping[str, str] | None]
SHM = "/dev/shm"
TERMINATION_LOG = "/dev/termination-log"
HANG_ANNOTATION = "taugrid.io/hang-timeout"  # resilience.hang_timeout, a local extension (see shim)


class PodSpecError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass
class ContainerRun:
    """One container as the shim runs it."""

    name: str
    command: list[str]
    env: dict[str, str]
    cwd: str
    memory_limit: int = 0  # bytes; 0 = none
    termination_path: str = ""  # host file standing in for terminationMessagePath
    termination_policy: str = "File"  # or FallbackToLogsOnError
    # Run through a container engine (``containers``): the engine and the container's name there; else "".
    engine: str = ""
    engine_name: str = ""
    # The OS user and group the process runs as (``taugrid.local.runas``); -1: the shim's own.
    uid: int = -1
    gid: int = -1

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "command": self.command, "env": self.env, "cwd": self.cwd,
                "memory_limit": self.memory_limit, "termination_path": self.termination_path,
                "termination_policy": self.termination_policy, "engine": self.engine,
                "engine_name": self.engine_name, "uid": self.uid, "gid": self.gid}


@dataclass
class PodRun:
    init: list[ContainerRun] = field(default_factory=list)
    containers: list[ContainerRun] = field(default_factory=list)
    deadline_s: float = 0.0
    grace_s: float = 30.0
    hang_s: float = 0.0
    volume_dirs: list[str] = field(default_factory=list)  # to create before the shim starts

    def to_json(self) -> dict[str, Any]:
        return {"init": [c.to_json() for c in self.init], "containers": [c.to_json() for c in self.containers],
                "deadline_s": self.deadline_s, "grace_s": self.grace_s, "hang_s": self.hang_s}


# ---------------------------------------------------------------- $(VAR) expansion


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``third_party/forked/golang/expansion``): ``$(NAME)`` becomes the value
    when ``lookup`` knows NAME, and stays as written when it does not; ``$$`` is an escaped ``$`` (so ``$$(X)``
    gives ``$(X)``); a ``$`` before anything else, and an unclosed ``$(``, are kept."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append("$(")
                i += 2
                continue
            name = text[i + 2:close]
            value = lookup(name)
            out.append(f"$({name})" if value is None else value)
            i = close + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


# ---------------------------------------------------------------- volumes


def mounts_of(pod: Mapping[str, Any], container: Mapping[str, Any], *, pod_dir: Path, claims_dir: Path,
              resolve_secret: Resolver, resolve_config_map: Resolver,
              created: list[str]) -> list[tuple[str, str]]:
    """(mountPath, host directory) for each of the container's volume mounts, longest mountPath first so that
    nested mounts are rewritten before their parents."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ns = str(meta.get("namespace") or "default")
    volumes = {str(v.get("name")): v for v in spec.get("volumes") or []}
    out: list[tuple[str, str]] = []
    for i, m in enumerate(container.get("volumeMounts") or []):
        where = f"containers[{container.get('name')}].volumeMounts[{i}]"
        vol = volumes.get(str(m.get("name")))
        if vol is None:
            raise PodSpecError("CreateContainerConfigError",
                               f"{where}: no volume named {m.get('name')!r} in spec.volumes")
        mount_path = str(m.get("mountPath") or "").rstrip("/") or "/"
        if "emptyDir" in vol:
            if mount_path == SHM:
                continue  # the host's shared memory is what the container would get
            host = pod_dir / "volumes" / str(vol["name"])
        elif "persistentVolumeClaim" in vol:
            claim = str((vol["persistentVolumeClaim"] or {}).get("claimName") or "")
            if not claim:
                raise PodSpecError("CreateContainerConfigError",
                                   f"volume {vol['name']}: persistentVolumeClaim.claimName is empty")
            host = claims_dir / ns / claim
        elif "hostPath" in vol:
            host = Path(str((vol["hostPath"] or {}).get("path") or "/"))
        elif "configMap" in vol or "secret" in vol:
            base = secret_volumes_dir(pod_dir) if "secret" in vol else pod_dir / "volumes"
            host = base / str(vol["name"])
            _write_keys(vol, ns=ns, host=host, resolve_secret=resolve_secret,
                        resolve_config_map=resolve_config_map)
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise PodSpecError("CreateContainerConfigError",
                               f"volume {vol.get('name')}: type {kinds} is not supported by the local kubelet "
                               "(emptyDir, persistentVolumeClaim, hostPath, configMap, secret are)")
        if m.get("subPath"):
            host = host / str(m["subPath"])
        created.append(str(host))
        out.append((mount_path, str(host)))
    return sorted(out, key=lambda pair: -len(pair[0]))


SHARED_MEMORY = Path("/dev/shm")


def secret_volumes_dir(pod_dir: Path) -> Path:
    """Where a pod's ``secret`` volumes live: a 0700 directory in RAM (``/dev/shm``, the kubelet mounts a tmpfs for
    them) named by the pod directory, so a secret file never reaches a disk; the pod directory where the host has
    no ``/dev/shm``. Removed with the pod directory (``cleanup.remove_finished_pods``)."""
    if not SHARED_MEMORY.is_dir():
        return pod_dir / "volumes"
    key = hashlib.sha256(str(pod_dir.resolve()).encode()).hexdigest()[:24]
    return SHARED_MEMORY / f"taugrid-secrets-{os.getuid()}" / key


def _write_keys(vol: Mapping[str, Any], *, ns: str, host: Path, resolve_secret: Resolver,
                resolve_config_map: Resolver) -> None:
    kind, src = ("secret", vol["secret"]) if "secret" in vol else ("configMap", vol["configMap"])
    src = src or {}
    name = str(src.get("secretName") if kind == "secret" else src.get("name") or "")
    data = (resolve_secret if kind == "secret" else resolve_config_map)(ns, name)
    if data is None:
        if src.get("optional"):
            data = {}
        else:
            raise PodSpecError("CreateContainerConfigError", f"volume {vol.get('name')}: {kind} {name!r} not found")
    items = src.get("items") or [{"key": k, "path": k} for k in data]
    host.mkdir(parents=True, exist_ok=True, mode=0o700)
    if kind == "secret":
        for d in (host.parent.parent, host.parent, host):
            if d.is_relative_to(SHARED_MEMORY) and d != SHARED_MEMORY:
                os.chmod(d, 0o700)
    for item in items:
        key = str(item.get("key"))
        if key not in data:
            raise PodSpecError("CreateContainerConfigError",
                               f"volume {vol.get('name')}: {kind} {name!r} has no key {key!r}")
        target = host / str(item.get("path") or key)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if kind == "secret" else 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(data[key])


def rewrite_paths(text: str, mounts: list[tuple[str, str]]) -> str:
    """Replace each mountPath where it stands as a path (not inside a longer name) by its host directory."""
    for mount_path, host in mounts:
        if mount_path == "/":
            continue
        pattern = re.compile(rf"(?<![\w.\-/]){re.escape(mount_path)}(?=/|$|[^\w.\-])")
        text = pattern.sub(_literally(host), text)
    return text


# ---------------------------------------------------------------- env


def _literally(value: str) -> Callable[[re.Match[str]], str]:
    """A replacement that inserts ``value`` as it is (``re.sub`` would read backslashes in a string)."""
    return lambda _match: value


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], *, resolve_secret: Resolver,
                  resolve_config_map: Resolver) -> dict[str, str]:
    """The container's env in spec order: ``envFrom`` first, then ``env``, each entry expanded against the
    entries before it (as the kubelet does; later duplicates win)."""
    meta = pod.get("metadata") or {}
    ns = str(meta.get("namespace") or "default")
    cname = container.get("name")
    env: dict[str, str] = {}
    for i, src in enumerate(container.get("envFrom") or []):
        prefix = str(src.get("prefix") or "")
        kind, ref = ("secret", src["secretRef"]) if "secretRef" in src else ("configMap", src.get("configMapRef"))
        ref = ref or {}
        data = (resolve_secret if kind == "secret" else resolve_config_map)(ns, str(ref.get("name") or ""))
        if data is None:
            if ref.get("optional"):
                continue
            raise PodSpecError("CreateContainerConfigError",
                               f"containers[{cname}].envFrom[{i}]: {kind} {ref.get('name')!r} not found")
        for k, v in data.items():
            env[prefix + k] = v
    for item in container.get("env") or []:
        name = str(item.get("name"))
        if "valueFrom" in item:
            value = _value_from(pod, container, item["valueFrom"] or {}, ns=ns, var=name,
                                resolve_secret=resolve_secret, resolve_config_map=resolve_config_map)
            if value is None:
                continue  # an optional reference to something missing: the variable is not set
            env[name] = value
        else:
            env[name] = expand(str(item.get("value", "")), env.get)
    return env


def _value_from(pod: Mapping[str, Any], container: Mapping[str, Any], ref: Mapping[str, Any], *, ns: str, var: str,
                resolve_secret: Resolver, resolve_config_map: Resolver) -> str | None:
    where = f"containers[{container.get('name')}].env[{var}].valueFrom"
    for kind, resolver in (("secretKeyRef", resolve_secret), ("configMapKeyRef", resolve_config_map)):
        if kind in ref:
            sel = ref[kind] or {}
            name, key = str(sel.get("name") or ""), str(sel.get("key") or "")
            data = resolver(ns, name)
            what = "secret" if kind == "secretKeyRef" else "configmap"
            if data is None or key not in data:
                if sel.get("optional"):
                    return None
                missing = (f'{what} "{name}" not found' if data is None
                           else f"couldn't find key {key} in {what} {ns}/{name}")
                raise PodSpecError("CreateContainerConfigError", f"{where}.{kind}: {missing}")
            return data[key]
    if "fieldRef" in ref:
        return field_value(pod, str((ref["fieldRef"] or {}).get("fieldPath") or ""), where=where)
    if "resourceFieldRef" in ref:
        return _resource_value(container, ref["resourceFieldRef"] or {}, where=where)
    raise PodSpecError("CreateContainerConfigError", f"{where}: no secretKeyRef, configMapKeyRef, fieldRef or "
                                                     "resourceFieldRef")


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")


def field_value(pod: Mapping[str, Any], path: str, *, where: str = "fieldRef") -> str:
    """The downward API's ``fieldRef`` paths, with this host's loopback address as pod and host IP."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace") or "default",
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1", "status.podIPs": "127.0.0.1",
        "status.hostIPs": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path] or "")
    m = _SUBSCRIPT.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise PodSpecError("CreateContainerConfigError", f"{where}.fieldRef: unsupported fieldPath {path!r}")


def _resource_value(container: Mapping[str, Any], ref: Mapping[str, Any], *, where: str) -> str:
    resource = str(ref.get("resource") or "")
    kind, _, res = resource.partition(".")
    if kind not in ("limits", "requests") or res not in ("cpu", "memory", "ephemeral-storage"):
        raise PodSpecError("CreateContainerConfigError", f"{where}.resourceFieldRef: unsupported resource {resource!r}")
    raw = ((container.get("resources") or {}).get(kind) or {}).get(res)
    if raw is None:
        return "0"
    divisor = ref.get("divisor") or "1"
    if res == "cpu":
        return str(math.ceil(parse_cpu(raw) / parse_cpu(divisor)))
    return str(math.ceil(parse_memory(raw) / parse_memory(divisor)))


# ---------------------------------------------------------------- the whole pod


def plan(pod: Mapping[str, Any], *, pod_dir: Path, claims_dir: Path, base_env: Mapping[str, str],
         resolve_secret: Resolver, resolve_config_map: Resolver) -> PodRun:
    """Everything the shim needs to run ``pod``; raises :class:`PodSpecError` for what cannot run here."""
    spec = pod.get("spec") or {}
    policy = spec.get("restartPolicy") or "Always"
    if policy != "Never":
        raise PodSpecError("CreateContainerError",
                           f"spec.restartPolicy={policy}: the local kubelet runs each container once; use Never")
    created: list[str] = []
    work = pod_dir / "work"
    meta = pod.get("metadata") or {}
    engine = str((meta.get("annotations") or {}).get(ENGINE_ANNOTATION) or "")

    def one(c: Mapping[str, Any]) -> ContainerRun:
        mounts = mounts_of(pod, c, pod_dir=pod_dir, claims_dir=claims_dir, resolve_secret=resolve_secret,
                           resolve_config_map=resolve_config_map, created=created)
        # The termination message file is the kubelet's mount too: a host file per container.
        termination = pod_dir / "termination" / str(c.get("name"))
        mounts = [(str(c.get("terminationMessagePath") or TERMINATION_LOG), str(termination)), *mounts]
        env = container_env(pod, c, resolve_secret=resolve_secret, resolve_config_map=resolve_config_map)
        command = [expand(str(a), env.get) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
        if not command:
            raise PodSpecError("CreateContainerError",
                               f"containers[{c.get('name')}]: no command; the image's entrypoint is not read "
                               "locally, so command or args must name the program")
        command = [rewrite_paths(a, mounts) for a in command]
        env = {k: rewrite_paths(v, mounts) for k, v in env.items()}
        wd = str(c.get("workingDir") or "")
        cwd = rewrite_paths(wd, mounts) if wd else ""
        if not cwd:
            cwd = str(work)
        elif not Path(cwd).is_absolute():
            cwd = str(work / cwd)
        elif cwd == wd and not any(wd == m or wd.startswith(m.rstrip("/") + "/") for m, _ in mounts):
            cwd = str(work)  # a directory of the image: work/ stands in for it
        limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        run = ContainerRun(name=str(c.get("name")), command=command, env={**base_env, **env}, cwd=cwd,
                           memory_limit=int(parse_memory(limit)) if limit else 0,
                           termination_path=str(termination),
                           termination_policy=str(c.get("terminationMessagePolicy") or "File"))
        if engine:
            _in_engine(run, engine=engine, image=str(c.get("image") or ""), pod=str(meta.get("name")),
                       volumes=mounts[1:], extra=[str(termination.parent), str(work)])
        return run

    run = PodRun(init=[one(c) for c in spec.get("initContainers") or []],
                 containers=[one(c) for c in spec.get("containers") or []])
    if not run.containers:
        raise PodSpecError("CreateContainerError", "spec.containers is empty")
    run.deadline_s = float(spec.get("activeDeadlineSeconds") or 0)
    grace = spec.get("terminationGracePeriodSeconds")
    run.grace_s = float(30 if grace is None else grace)
    hang = ((pod.get("metadata") or {}).get("annotations") or {}).get(HANG_ANNOTATION)
    run.hang_s = float(hang or 0)
    run.volume_dirs = [*created, str(work), str(pod_dir / "termination")]
    for c in [*run.init, *run.containers]:
        if c.cwd not in run.volume_dirs:
            run.volume_dirs.append(c.cwd)
    return run


def _in_engine(run: ContainerRun, *, engine: str, image: str, pod: str, volumes: list[tuple[str, str]],
               extra: list[str]) -> None:
    """Make ``run`` start its command in ``image`` through ``engine`` (see ``containers``)."""
    if not image:
        raise PodSpecError("CreateContainerError", f"containers[{run.name}]: no image to run in {engine}")
    name = containers.container_name(pod, run.name)
    mounts = containers.mounts_for(volumes=volumes, env=run.env, extra=extra)
    run.command = containers.run_argv(run.command, engine=engine, image=image, name=name, cwd=run.cwd, env=run.env,
                                      mounts=mounts, memory_limit=run.memory_limit)
    run.engine, run.engine_name = engine, name


# Kueue's topology request, and the tau.yaml key that asked it: honoured by the local admission only when the
# platform declares topologies (``LocalAdmitter.tas``); without them no flavor is a TAS flavor here.
_TOPOLOGY_ANNOTATIONS = {
    "kueue.x-k8s.io/podset-required-topology": "policy.topology",
    "kueue.x-k8s.io/podset-preferred-topology": "policy.topology",
    "kueue.x-k8s.io/podset-unconstrained-topology": "policy.topology_policy",
    "kueue.x-k8s.io/podset-slice-required-topology": "policy.topology_slice",
}


def kubernetes_only(manifest: dict[str, Any], *, in_engine: bool = False, tas: bool = False) -> str:
    """A warning naming the config keys whose pod fields mean nothing on this host ("" when none): the pod's
    priority class (the local admitter orders by the workload's priority only), Kueue's topology request (unless
    ``tas``: the platform declares topologies and the local admission placed the pod by it), and the run-as ids of
    a host process (it runs as the stack's user)."""
    spec = manifest.get("spec") or {}
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    keys = []
    if spec.get("priorityClassName"):
        keys.append("policy.pod_priority_class")
    if not tas:
        keys += sorted({key for a, key in _TOPOLOGY_ANNOTATIONS.items() if a in annotations})
    security = spec.get("securityContext") or {}
    in_engine = in_engine or bool(annotations.get(ENGINE_ANNOTATION))
    if not in_engine and ("runAsUser" in security or "runAsGroup" in security):
        keys.append("runtime.security.run_as_user/run_as_group")
    if not keys:
        return ""
    return (f"{', '.join(keys)} {'has' if len(keys) == 1 else 'have'} no effect on the local backend "
            "(Kubernetes only)")
