"""Identifiers and subject-safe tokens.

Invariant: every id that lands in a NATS subject or a Kubernetes name matches ``[a-z0-9-]`` (runs) or
``[A-Za-z0-9_-]`` (other tokens), so subjects never gain extra tokens and object names stay DNS-1123.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import NewType

RunId = NewType("RunId", str)
NodeName = NewType("NodeName", str)
Workspace = NewType("Workspace", str)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_DNS = re.compile(r"[^a-z0-9-]")


def token(value: str) -> str:
    """Sanitise a value for use as one NATS subject token."""
    cleaned = _UNSAFE.sub("_", value)
    return cleaned or "_"


def dns_label(value: str, *, max_len: int = 63) -> str:
    """Lower-case DNS-1123 label: letters, digits and dashes, starting and ending alphanumeric."""
    cleaned = _DNS.sub("-", value.lower()).strip("-")
    cleaned = re.sub(r"-{2,}", "-", cleaned)
    return (cleaned[:max_len].rstrip("-")) or "run"


# 64 bits of sha256: among a million runs sharing one name the chance that any two distinct submissions
# meet is about 3e-8 (24 bits, the old width, merged 3 of 10,500 same-named runs in one benchmark).
RUN_ID_DIGEST_HEX = 16
_RUN_ID = re.compile(rf"[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9a-f]{{{RUN_ID_DIGEST_HEX}}}")
RUN_NAME_MAX = 40  # so a run id (≤ 57) plus an attempt suffix (`-a12`) stays a 63-character DNS label


def new_run_id(name: str, submission_id: str) -> RunId:
    """Run ids read as ``<name>-<16 hex>``: stable for one submission id, so a repeated submission maps to
    one run, and distinct submission ids get distinct run ids (64-bit digest)."""
    digest = hashlib.sha256(submission_id.encode()).hexdigest()[:RUN_ID_DIGEST_HEX]
    return RunId(f"{dns_label(name, max_len=RUN_NAME_MAX)}-{digest}")


def is_run_id(text: str) -> bool:
    """Whether ``text`` has the shape of a run id (``<dns label>-<16 hex>``), as every run's default output
    directory is named."""
    return _RUN_ID.fullmatch(text) is not None



def run_claim(text: str) -> tuple[str, str | None]:
    """The submitter's claim of a run id (``submissions`` KV, ``id.<run>``): ``<ws>:<seq>`` (the workspace and the
    RUNS sequence of the run's first request) or ``<ws>`` alone; (workspace, sequence or None). Read by the
    submitter and the policy alike, so the two never read the claim differently."""
    ws, colon, seq = text.rpartition(":")
    return (ws, seq) if colon else (text, None)

def new_submission_id() -> str:
    """Time-ordered random id for a client submission (clients may supply their own for idempotency)."""
    return f"{int(time.time() * 1000):x}{secrets.token_hex(6)}"
