"""TauGrid's input limits, in one place so the client, the validators and the services agree.

Every byte a person sends is bounded before anything is derived from it: a document's size and the number of
YAML nodes its aliases expand to (a "billion laughs" stops at the bound, not at the memory limit), a literal env
value and the env total (TauGrid's own limits), a submission's payload, and every event a service publishes
(well below the server's ``max_payload`` of 8 MB, so a derived event can never be refused by the server and
leave a run stuck). Pure constants: no I/O.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB

TAU_YAML_MAX_BYTES = 256 * KIB
"""A ``tau.yaml``: TauGrid's env limits (128 KiB in total) plus room for everything else."""
PLATFORM_YAML_MAX_BYTES = 1 * MIB
"""A ``platform.yaml`` (many workspaces and users)."""
YAML_MAX_NODES = 20_000
"""YAML nodes after alias expansion; real configs have hundreds."""

ENV_VALUE_MAX = 64 * KIB
ENV_TOTAL_MAX = 128 * KIB

SUBMISSION_MAX_BYTES = 512 * KIB
"""A ``submit.requested`` body: the config text (≤ 256 KiB) plus its metadata, with room to spare."""
EVENT_MAX_BYTES = 2 * MIB
"""Any event a service or client publishes: a quarter of the server's ``max_payload`` (8 MB)."""

SNAPSHOT_MAX_BYTES = 64 * MIB
"""A project snapshot's files, before archiving (the client refuses more, naming the biggest files)."""
SNAPSHOT_UPLOAD_MAX_BYTES = SNAPSHOT_MAX_BYTES + 16 * MIB
"""The archive the submitter accepts from ``uploads``: the files plus tar's per-file headers, even uncompressible."""

DEFAULT_SUBMISSIONS_PER_MINUTE = 120
"""Per workspace, unless ``workspaces[].submissions_per_minute`` says otherwise (0 = unlimited)."""


def size_text(n: int) -> str:
    """``262144`` → ``256 KiB``; for messages that state a limit."""
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} bytes"
