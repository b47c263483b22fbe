"""A tiny pure-Python wheel built on the spot, so environment tests install something real without an index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(directory: Path, *, name: str = "tauprobe", version: str = "1.0", value: str = "42") -> Path:
    """``<directory>/<name>-<version>-py3-none-any.whl``: a module ``<name>`` with ``VALUE = <value>``."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"VALUE = {value}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path
