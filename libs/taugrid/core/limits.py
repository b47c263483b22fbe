"""TauGrid's input limits, in one place so the client, the validators and the services agree.

Every byte a person sends is bounded before anything is derived from it: a document's size, and the nodes, bytes
and depth its YAML aliases expand to (a "billion laughs" stops at the bound, not at the memory limit), how deep an
event's JSON nests (every decoder refuses it before recursing), a literal env
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
PLATFORM_YAML_MAX_NODES = 200_000
"""A ``platform.yaml``'s nodes after alias expansion: Kueue's large-scale test (1,000 ClusterQueues, each with
its local queue and workspace) has about 57,000; a platform that fills its 1 MiB text limit has no more than
this."""
TAU_YAML_MAX_EXPANDED_BYTES = 512 * KIB
"""A ``tau.yaml`` once its aliases are expanded, counted as JSON (what ``submit.accepted`` carries): twice the
text's own limit, so an alias-free document always fits and ``submit.accepted`` stays far below ``EVENT_MAX_BYTES``
(12,000 aliases of one 100 KiB string were 150 KB of YAML and a 1.2 GB event)."""
PLATFORM_YAML_MAX_EXPANDED_BYTES = 2 * MIB
"""A ``platform.yaml`` once its aliases are expanded (twice its text's limit)."""
YAML_MAX_DEPTH = 32
"""Levels of nested mappings and lists in a YAML document, aliases expanded; real configs have under ten."""
EVENT_MAX_DEPTH = 64
"""Levels of nesting in an event's JSON payload: a parsed ``tau.yaml`` (``YAML_MAX_DEPTH``) inside an event fits,
and every reader decodes far from Python's recursion limit (a 200k-deep body crashed readers with RecursionError)."""

ENV_VALUE_MAX = 64 * KIB
ENV_TOTAL_MAX = 128 * KIB

SUBMISSION_MAX_BYTES = 512 * KIB
"""A ``submit.requested`` body: the config text (≤ 256 KiB) plus its metadata, with room to spare."""
EVENT_MAX_BYTES = 2 * MIB
"""Any event a service or client publishes: a quarter of the server's ``max_payload`` (8 MB)."""
ACCEPTED_LINES_MAX_BYTES = 64 * KIB
"""The key lines the policy reads back to place a refusal (``config.accepted``; ``submit.accepted`` carried them
before issue 27), as JSON: each names its key's whole path, so a 45 KB config of 3,000 keys under one
1,000-character key was 3 MB of them; real configs need a few KB."""

SNAPSHOT_MAX_BYTES = 64 * MIB
"""A project snapshot's files, before archiving (the client refuses more, naming the biggest files)."""
SNAPSHOT_UPLOAD_MAX_BYTES = SNAPSHOT_MAX_BYTES + 16 * MIB
"""The archive the submitter accepts from ``uploads``: the files plus tar's per-file headers, even uncompressible."""

DEFAULT_SUBMISSIONS_PER_MINUTE = 2000
"""Per workspace, unless ``workspaces[].submissions_per_minute`` says otherwise (0 = unlimited): that many are
admitted at once, then one every ``60 / rate`` seconds; the rest wait their turn
(``services/submitter/ratelimit.py``). So a 2,000-run sweep is admitted whole."""
PACED_SUBMISSIONS_MAX = 500
"""Submissions one workspace may have waiting for their slots: they wait as unacknowledged deliveries of the
submitter's durable (``max_ack_pending`` 2,000), so a quarter of it, leaving room for every other workspace."""


def size_text(n: int) -> str:
    """``262144`` → ``256 KiB``; for messages that state a limit."""
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} bytes"
