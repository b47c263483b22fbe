"""How a run's submitted project reaches its pods: an init container that fetches and verifies the snapshot.

Every pod of a Job or RayJob whose run carries a source snapshot (``run.source_digest``) gets:

* an ``emptyDir`` volume ``tau-source``;
* an init container ``tau-source-fetch`` from the taugrid image (``RenderSettings.fetch_image``) running
  ``python -m taugrid.sources.fetch``, which reads the snapshot object from the object store over NATS, checks
  its SHA-256 against the pod's own ``taugrid.io/source-digest`` annotation (downward API), and unpacks it
  into the volume; a mismatch or a missing object exits non-zero with a one-line reason, written to the
  container's termination message, so the pod fails with it;
* the volume mounted in the main containers, whose working directory becomes the project (see
  ``source_layout``).

Runs with ``run.source.image`` (TauGrid's source-image jobs) use the code already in their image and get no
fetch; so do runs submitted without a snapshot.

Invariants: pure and deterministic like the rest of ``render``; the fetcher's NATS URL and credentials come
from ``RenderSettings`` (the chart's values, read by the renderer service from its environment), never from
the run; credentials are a Secret mounted as a file, never a literal (the bus's CA certificate, public, is).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

import msgspec

from taugrid import __version__
from taugrid.core import manifestkeys
from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import PermanentError
from taugrid.render.common import container_security
from taugrid.settings import of as settings_of
from taugrid.settings.model import RendererSettings

SOURCE_DIR = "/tau/source"
# The fetch container's names, defined below the renderer so the local cluster reads them without it
SOURCE_VOLUME = manifestkeys.SOURCE_VOLUME
FETCH_CONTAINER = manifestkeys.FETCH_CONTAINER
SOURCE_DIGEST_ANNOTATION = manifestkeys.SOURCE_DIGEST_ANNOTATION
CREDS_VOLUME = "tau-nats-creds"
CREDS_DIR = "/etc/taugrid/nats"
CREDS_KEY = "creds"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
DEFAULT_FETCH_IMAGE = f"ghcr.io/taugrid/taugrid:{__version__}"
DEFAULT_FETCH_NATS_URL = "nats://taugrid-nats.taugrid.svc:4222"
# The fetch streams the archive to disk, so its memory does not grow with the project.
FETCH_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}


class RenderSettings(msgspec.Struct, frozen=True):
    """Cluster-wide rendering settings (not per run): where the source fetcher comes from and how it reaches
    the bus. The chart sets them on the renderer Deployment; the renderer service builds them from its settings
    (``from_settings``), ``from_env`` from an environment's."""

    fetch_image: str = DEFAULT_FETCH_IMAGE
    nats_url: str = DEFAULT_FETCH_NATS_URL
    # A Secret (in each workspace namespace) whose key ``creds`` is a NATS credentials file allowed to read
    # ``sources/*`` from the object store; empty = the fetcher connects without credentials.
    nats_creds_secret: str = ""
    # The CA (PEM text, public) that signed the bus's TLS certificate when the server requires TLS; empty: the
    # system's CAs, or no TLS. Passed as TAU_NATS_CA_PEM, so run namespaces need no copy of the CA.
    nats_ca_pem: str = ""

    @classmethod
    def from_settings(cls, given: RendererSettings) -> RenderSettings:
        """From the renderer's settings (``TAU_SOURCE_FETCH_*``); the CA file is read here, once, as PEM text."""
        try:
            ca_pem = given.fetch_nats_ca.read_text() if given.fetch_nats_ca is not None else ""
        except OSError as exc:
            raise PermanentError(f"TAU_SOURCE_FETCH_NATS_CA={given.fetch_nats_ca}: cannot read the bus's CA "
                                 f"certificate ({exc.strerror or exc}); check the chart's nats.embedded.tls "
                                 "values") from exc
        return cls(
            fetch_image=given.fetch_image or DEFAULT_FETCH_IMAGE,
            nats_url=given.fetch_nats_url or DEFAULT_FETCH_NATS_URL,
            nats_creds_secret=given.fetch_creds_secret,
            nats_ca_pem=ca_pem,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RenderSettings:
        """From ``env``'s settings (default: this process's)."""
        return cls.from_settings(settings_of(env).renderer)


DEFAULT_SETTINGS = RenderSettings()


class SourceLayout(msgspec.Struct, frozen=True):
    """Where the project lives in a main container: the volume's mount path and the working directory."""

    mount_path: str
    working_dir: str


def needs_fetch(run: ResolvedRun) -> bool:
    return bool(run.source_digest) and not run.source_image


def source_layout(run: ResolvedRun) -> SourceLayout:
    """The project is mounted at ``/tau/source``, which is the working directory, with TauGrid's meanings of
    the working-directory keys kept: an absolute Job ``runtime.working_dir`` is the container directory the
    project is mounted at (so the entrypoint is found there); a relative one, and Ray's ``run.working_dir``
    (the project directory relative to the config file), is a directory inside the project."""
    wd = run.working_dir.strip()
    if run.engine == "job" and wd.startswith("/"):
        path = posixpath.normpath(wd)
        return SourceLayout(mount_path=path, working_dir=path)
    inner = posixpath.normpath(posixpath.join(SOURCE_DIR, wd)) if wd else SOURCE_DIR
    return SourceLayout(mount_path=SOURCE_DIR, working_dir=inner)


def source_volumes(run: ResolvedRun, settings: RenderSettings) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [{"name": SOURCE_VOLUME, "emptyDir": {}}]
    if settings.nats_creds_secret:
        volumes.append(
            {
                "name": CREDS_VOLUME,
                "secret": {
                    "secretName": settings.nats_creds_secret,
                    "items": [{"key": CREDS_KEY, "path": CREDS_KEY}],
                    "defaultMode": 0o440,
                },
            }
        )
    return volumes


def source_mount(run: ResolvedRun) -> dict[str, Any]:
    return {"name": SOURCE_VOLUME, "mountPath": source_layout(run).mount_path}


def fetch_container(run: ResolvedRun, settings: RenderSettings) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": "TAU_NATS_URL", "value": settings.nats_url},
        {"name": "TAU_SOURCE_OBJECT", "value": run.source_object or snapshot_object(run.source_digest)},
        {
            "name": "TAU_SOURCE_DIGEST",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{SOURCE_DIGEST_ANNOTATION}']"}},
        },
        {"name": "TAU_TERMINATION_MESSAGE_PATH", "value": TERMINATION_MESSAGE_PATH},
    ]
    mounts: list[dict[str, Any]] = [{"name": SOURCE_VOLUME, "mountPath": SOURCE_DIR}]
    if settings.nats_ca_pem:
        env.append({"name": "TAU_NATS_CA_PEM", "value": settings.nats_ca_pem})
    if settings.nats_creds_secret:
        env.append({"name": "TAU_NATS_CREDS", "value": f"{CREDS_DIR}/{CREDS_KEY}"})
        mounts.append({"name": CREDS_VOLUME, "mountPath": CREDS_DIR, "readOnly": True})
    container: dict[str, Any] = {
        "name": FETCH_CONTAINER,
        "image": settings.fetch_image,
        "command": ["python", "-m", "taugrid.sources.fetch"],
        # The fetcher unpacks into its working directory, the volume: a kubelet that maps volumes to host
        # directories (the local one) needs nothing but workingDir to run it.
        "workingDir": SOURCE_DIR,
        "env": env,
        "resources": {k: dict(v) for k, v in FETCH_RESOURCES.items()},
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if (csec := container_security(run)) is not None:
        container["securityContext"] = csec
    return container


def snapshot_object(digest: str) -> str:
    """The object store name the client gives a snapshot (``sources/archive.py``)."""
    return f"sources/{digest.removeprefix('sha256:')}.tar.gz"


def add_source(
    pod: dict[str, Any], containers: list[dict[str, Any]], run: ResolvedRun, settings: RenderSettings
) -> None:
    """Give ``pod`` the fetch init container and volumes, and each of ``containers`` the project mount and
    working directory. Does nothing for a run that needs no fetch."""
    if not needs_fetch(run):
        return
    layout = source_layout(run)
    for container in containers:
        container.setdefault("volumeMounts", []).insert(0, source_mount(run))
        container["workingDir"] = layout.working_dir
    pod["initContainers"] = [fetch_container(run, settings)]
    pod["volumes"] = source_volumes(run, settings) + list(pod.get("volumes") or [])
