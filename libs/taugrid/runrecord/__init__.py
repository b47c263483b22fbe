"""The run record: one record per run in the ``run_state`` KV bucket, the fold of the run's events.

``projection`` writes it (only the ``run_record`` service runs it, ``services/run_record``); ``read`` is the one
way every other stage, the client and the portal read it, with one rule for a record the projection has not
written yet (``read.require``: wait, never decide). Stages import the package and use its names.
"""

from taugrid.runrecord.projection import HISTORY, Projector, RecordCache, project
from taugrid.runrecord.read import (
    BUCKET,
    UNDECIDED,
    Summary,
    VerifiedUsers,
    create,
    find,
    get,
    get_for,
    key,
    list_records,
    not_projected,
    require,
    require_resolved,
    summary,
)

__all__ = ["BUCKET", "HISTORY", "UNDECIDED", "Projector", "RecordCache", "Summary", "VerifiedUsers", "create", "find",
           "get", "get_for", "key", "list_records", "not_projected", "project", "require", "require_resolved",
           "summary"]
