"""A pod's containers run through a container engine (docker or podman): the command lines, and what their exits
mean. No processes (the shim runs them); the one look at the filesystem is whether one of the run's directory
variables (``MOUNTED_ENV``) names a directory to mount.

The local cluster marks a pod whose run names ``runtime.image`` and finds an engine that answers with the
annotation ``taugrid.io/container-engine: <engine>``; the kubelet then runs every container of that pod as
``<engine> run --rm --init --name <pod>-<container> … <image> <command>`` instead of a host process:

- the working directory and every volume's host directory are mounted at their host paths (the kubelet has
  already rewritten ``mountPath`` references in command, args and env to those paths) and, for volumes, at their
  ``mountPath`` too, so a program that hard-codes ``/data/x`` finds it; so are the directories named by
  ``TAU_OUTPUT_DIR``, ``TAU_CHECKPOINT_DIR`` and ``TAU_RESUME_FROM`` (the local platform's output, checkpoint and
  resume directories), and by no other variable;
- the container's variables are passed by name (``-e NAME``: the value comes from the engine client's own
  environment, which the shim sets to the container's), except the host's own (``PATH``, ``HOME``, …, which mean
  nothing inside an image);
- GPUs, by the vendor whose variable names them (``core/devices``): NVIDIA's ``CUDA_VISIBLE_DEVICES`` as
  ``--gpus device=…`` for docker, CDI ``--device nvidia.com/gpu=N`` for podman; AMD's ``ROCR_VISIBLE_DEVICES`` as
  CDI ``--device amd.com/gpu=N`` on both (AMD's container toolkit generates that spec); each renumbered from 0
  inside, as the devices are (ROCR's and HIP's both); Gaudi's ``HABANA_VISIBLE_DEVICES`` as ``--runtime habana``
  with the host indices, which that runtime's hook reads to map the devices (Gaudi ships no CDI spec);
- host networking (the rendezvous of a multi-pod run is on loopback); the memory limit as ``--memory``;
- stop: ``<engine> stop -t <grace> <name>`` (SIGTERM, then the engine's SIGKILL after the grace period; the
  shim builds it when the stop comes, with that stop's grace),
  ``<engine> kill <name>`` when the shim's own grace runs out, ``<engine> rm -f <name>`` before a start (a
  container left by a shim that died) and when a lost shim's pod is cleaned up.

Exit codes are the container's own, as ``<engine> run`` passes them on, except 125 (the engine could not run the
container: no such image, a bad option): ``StartError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from taugrid.core.devices import VENDORS, VISIBILITY_ENV
from taugrid.core.quantity import human_bytes

ENGINE_ANNOTATION = "taugrid.io/container-engine"
# Host variables that mean nothing inside a container.
HOST_ONLY_ENV = frozenset({"PATH", "HOME", "LANG", "TMPDIR", "USER", "PYTHONPATH", "VIRTUAL_ENV"})
ENGINE_FAILED_EXIT = 125  # docker/podman run: the engine itself failed, the container never ran
SIGKILL_EXIT = 137
# The variables whose directories are mounted: the run's output, checkpoint and resume directories, each checked to
# lie in the run's workspace by the policy (`config/resolve.py`). Not any TAU_* variable: the platform passes the
# config's own strings in others (TAU_TUNE_METRIC, TAU_RETRY_REASON, a TAU_CHECKPOINT_ARTIFACT joined onto an
# absolute path), and a config naming the stack's data directory there had it mounted into its container.
MOUNTED_ENV = ("TAU_OUTPUT_DIR", "TAU_CHECKPOINT_DIR", "TAU_RESUME_FROM")
# Directories never mounted, even when a variable names them.
_SYSTEM = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/sbin", "/sys", "/usr", "/var")


def container_name(pod: str, container: str) -> str:
    return f"{pod}-{container}"


def run_argv(command: list[str], *, engine: str, image: str, name: str, cwd: str, env: Mapping[str, str],
             mounts: Iterable[tuple[str, str]], memory_limit: int) -> list[str]:
    """``<engine> run`` for one container. ``mounts`` are (host directory, path inside) pairs; ``env`` is the
    container's environment, passed by name (the engine client must run with it)."""
    out = [engine, "run", "--rm", "--init", "--name", name, "--network", "host", "-w", cwd]
    seen: set[str] = set()
    for host, inside in [(cwd, cwd), *mounts]:
        spec = f"{host}:{inside}"
        if spec not in seen:
            seen.add(spec)
            out += ["-v", spec]
    for key in sorted(env):
        if key in HOST_ONLY_ENV or key in VISIBILITY_ENV:
            continue
        out += ["-e", key]
    out += device_args(engine, env)
    if memory_limit:
        out += ["--memory", str(memory_limit)]
    return [*out, image, *command]


def device_args(engine: str, env: Mapping[str, str]) -> list[str]:
    """The engine options that map a pod's GPUs into its container, read from its vendor's variable."""
    for vendor in VENDORS.values():
        gpus = [g.strip() for g in env.get(vendor.device_env[0], "").split(",") if g.strip()]
        if gpus:
            break
    else:
        return ["-e", "NVIDIA_VISIBLE_DEVICES"] if "NVIDIA_VISIBLE_DEVICES" in env else []  # "void": none at all
    inside = ",".join(str(i) for i in range(len(gpus)))
    # a pod of another vendor keeps NVIDIA's "void", whatever the image's own NVIDIA_VISIBLE_DEVICES says
    out = ["-e", "NVIDIA_VISIBLE_DEVICES"] if vendor.name != "nvidia" and "NVIDIA_VISIBLE_DEVICES" in env else []
    if vendor.name == "nvidia":
        out += ["-e", "CUDA_VISIBLE_DEVICES=" + inside]
        return out + (["--gpus", "device=" + ",".join(gpus)] if Path(engine).name == "docker"
                      else [arg for g in gpus for arg in ("--device", vendor.cdi_device(g))])
    if vendor.cdi_kind:
        out += [arg for k in (*vendor.device_env, *vendor.ordinal_env) for arg in ("-e", f"{k}={inside}")]
        return out + [arg for g in gpus for arg in ("--device", vendor.cdi_device(g))]
    return [*out, "--runtime", vendor.oci_runtime,
            *(arg for k in vendor.device_env for arg in ("-e", f"{k}={','.join(gpus)}"))]


def mounts_for(*, volumes: Iterable[tuple[str, str]], env: Mapping[str, str],
               extra: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(host, inside) pairs: each volume at its host path and at its ``mountPath``, ``extra`` host directories
    at their own paths, and the existing directories that ``MOUNTED_ENV`` names (outputs, checkpoints, resume)."""
    out: list[tuple[str, str]] = []
    for mount_path, host in volumes:
        out.append((host, host))
        if mount_path != host and mount_path not in _SYSTEM:
            out.append((host, mount_path))
    out += [(d, d) for d in extra]
    named = sorted({env[k] for k in MOUNTED_ENV if k in env and _is_data_dir(env[k])})
    for d in named:
        if not any(d == h or d.startswith(h.rstrip("/") + "/") for h, _ in out):  # not inside a mount already
            out.append((d, d))
    return out


def _is_data_dir(value: str) -> bool:
    path = Path(value)
    return path.is_absolute() and str(path) not in _SYSTEM and path.is_dir()


def stop_argv(engine: str, name: str, grace_s: float) -> list[str]:
    return [engine, "stop", "-t", str(max(0, int(grace_s))), name]


def kill_argv(engine: str, name: str) -> list[str]:
    return [engine, "kill", name]


def remove_argv(engine: str, name: str) -> list[str]:
    return [engine, "rm", "-f", name]


def exit_reason(code: int, *, stopped: bool, memory_limit: int) -> tuple[str, str] | None:
    """(reason, message) for an engine client's exit code where it means more than the container's own exit
    (None: read it as a process's exit code)."""
    if code == ENGINE_FAILED_EXIT:
        return "StartError", "the container engine could not run the container (exit 125): see the container's log"
    if code == SIGKILL_EXIT and memory_limit and not stopped:
        return "OOMKilled", f"killed by SIGKILL inside the container's memory limit ({human_bytes(memory_limit)})"
    return None
