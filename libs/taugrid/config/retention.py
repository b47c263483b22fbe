"""``platform.yaml``'s ``retention``: how long, and how much, the bus keeps of run history, logs and the audit
stream, and where a sealed run's evidence is archived out of the bus.

Applied by the bootstrap (``taugrid.bus.bootstrap``) when it creates a stream; a stream that exists already and
differs is reported, and ``python -m taugrid.bus.bootstrap --update`` (the break-glass identity: the bootstrap
identity may not change a stream) applies it. The archive is written by the evidence service at each seal
(``taugrid.evidence.archive``). Invariants: every default here is the limit the bus had before the setting
existed (run history 30 d, LOGS 14 d, AUDIT 365 d, no size limits, evidence kept on the bus); nothing here can
make the bus forget something verification still needs: AUDIT keeps at least as long as HISTORY, and evidence
leaves the bus only into an archive, never by age.

``runs`` (the key it always had) bounds the run history (issue 27): HISTORY keeps every run's events for it (the
record read back), and RUNS, the stages' input since it has interest retention, keeps an event at most that long
while a stage has not acked it (one acked by every reader goes at once, whatever this says).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pydantic
from pydantic import Field

from taugrid.config.fields import Duration, MemoryQuantity, Strict
from taugrid.core.quantity import parse_memory

DAY = 86400.0
RUNS_MAX_AGE_S = 30 * DAY
LOGS_MAX_AGE_S = 14 * DAY
AUDIT_MAX_AGE_S = 365 * DAY
MIN_HISTORY_S = DAY  # a run's events must outlive the run's seal: the evidence reads them back from HISTORY
MIN_LOGS_S = 3600.0  # the evidence reads a run's logs back at its seal
MIN_BYTES = 64 * 1024 * 1024  # below this a stream drops a busy run's events before its seal


def _positive_bytes(value: str | None, field: str) -> str | None:
    if value is not None and parse_memory(value) < MIN_BYTES:
        raise ValueError(f"{field} {value} is below 64Mi: the stream would drop a run's events before the "
                         f"evidence seals it; write at least 64Mi, or leave it out (no size limit)")
    return value


class _StreamRetention(Strict):
    """A stream bounded by age (at least ``min_age_s``: the evidence reads it back at a run's seal) and, if written,
    by size (at least ``MIN_BYTES``)."""

    stream: ClassVar[str]  # its key under retention
    min_age_s: ClassVar[float]
    too_young: ClassVar[str]  # the refusal of a max_age under min_age_s, with its fix

    max_age: Duration
    max_bytes: MemoryQuantity | None = None

    @pydantic.field_validator("max_age")
    @classmethod
    def _age(cls, v: float) -> float:
        if v < cls.min_age_s:
            raise ValueError(cls.too_young)
        return v

    @pydantic.field_validator("max_bytes")
    @classmethod
    def _bytes(cls, v: str | None) -> str | None:
        return _positive_bytes(v, f"{cls.stream}.max_bytes")


class RunsRetention(_StreamRetention):
    """The runs' events: HISTORY keeps every run's (read back at the seal, by `tau events`, the portal and
    `tau verify`) for this long; RUNS, the stages' input, keeps an event its stages have not acked at most this
    long (``stream_limits``: both streams get these limits)."""

    stream, min_age_s = "runs", MIN_HISTORY_S
    too_young = ("runs.max_age is under 1d: a run's events must still be in HISTORY when it is sealed; write at "
                 "least 1d (a run's sealed evidence holds its events after that; AUDIT its requests, end and seal)")

    max_age: Duration = Field(default=RUNS_MAX_AGE_S, description="how long HISTORY keeps a run's events, and RUNS "
                              "an event its stages have not read (default 30d, at least 1d; a sealed run's "
                              "evidence keeps them all, AUDIT its requests, end and seal)")
    max_bytes: MemoryQuantity | None = Field(default=None, description="HISTORY's size, and RUNS'; the oldest "
                                             "events go first (default: no size limit; at least 64Mi)")


class LogsRetention(_StreamRetention):
    """The LOGS stream: runs' log lines (a sealed run's logs are also in its evidence bundle)."""

    stream, min_age_s = "logs", MIN_LOGS_S
    too_young = "logs.max_age is under 1h: the evidence reads a run's logs back when it is sealed; write at least 1h"

    max_age: Duration = Field(default=LOGS_MAX_AGE_S, description="how long LOGS keeps a log chunk (default "
                              "14d, at least 1h)")
    max_bytes: MemoryQuantity | None = Field(default=None, description="LOGS' size; the oldest chunks go first "
                                             "(default: no size limit; at least 64Mi)")


class AuditRetention(Strict):
    """AUDIT, append-only, keeps of RUNS what `tau verify` checks every sealed run against (the people's requests,
    each run's end and its seal: ``topology.AUDIT_KEPT_EVENTS``)."""

    max_age: Duration = Field(default=AUDIT_MAX_AGE_S, description="how long AUDIT keeps an event (default "
                              "365d; at least runs.max_age, HISTORY's). `tau verify` of a run older than this "
                              "reports its events missing from AUDIT")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _no_size(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_bytes" in data:
            raise ValueError("audit.max_bytes is not supported: a size limit would drop audit events under load, "
                             "before their age; bound AUDIT by audit.max_age")
        return data


class S3Location(Strict):
    endpoint: str = Field(default="", description="the S3 API's URL (e.g. https://minio.storage:9000); empty: "
                          "AWS S3 itself")
    bucket: str = Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$",
                        description="an existing bucket (S3 bucket naming rules)")
    prefix: str = Field(default="taugrid/evidence", description="object keys start with it")
    region: str = Field(default="us-east-1", description="the bucket's region (S3-compatible servers accept any)")

    @pydantic.field_validator("endpoint")
    @classmethod
    def _url(cls, v: str) -> str:
        if v and not v.startswith(("https://", "http://")):
            raise ValueError(f"evidence.archive.s3.endpoint {v!r} is not a URL; write https://host:port")
        return v

    @pydantic.field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/"):
            raise ValueError(f"evidence.archive.s3.prefix {v!r} starts with / or has a .. part; write a relative "
                             f"key prefix such as taugrid/evidence")
        return v.strip("/")


class Archive(Strict):
    """Where sealed evidence goes: exactly one of ``directory`` (files under a directory of the machine the
    evidence service runs on: the embedded stack) or ``s3`` (an S3-compatible object store: Kubernetes).
    Credentials for S3 are not in platform.yaml: the evidence service (and `tau verify`/`tau evidence` of an
    archived run) take them from the standard AWS environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or a
    profile); the S3 client is the ``s3`` extra (boto3)."""

    directory: str | None = Field(default=None, description="an absolute path; created 0750 when missing, and "
                                  "refused when anyone but its owner may write it")
    s3: S3Location | None = None

    @pydantic.field_validator("directory")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"evidence.archive.directory {v!r} is not an absolute path; write the full path, "
                             f"e.g. /var/lib/taugrid/archive")
        return v

    @pydantic.model_validator(mode="after")
    def _one(self) -> Archive:
        if (self.directory is None) == (self.s3 is None):
            raise ValueError("evidence.archive needs exactly one of directory or s3; write "
                             "{directory: /var/lib/taugrid/archive} or {s3: {endpoint, bucket, prefix}}")
        return self

    def where(self) -> str:
        """The archive in words, for reports: ``directory /path`` or ``s3://bucket/prefix``."""
        if self.s3 is not None:
            return f"s3://{self.s3.bucket}/{self.s3.prefix}"
        return f"directory {self.directory}"


class EvidenceRetention(Strict):
    """Sealed evidence (bundles, separately stored logs, kept outputs): kept on the bus (the default) or moved at
    the seal into an archive, the bus keeping the run's ledger with the bundle's digest, which verifies it."""

    archive: Archive | None = Field(
        default=None, description="{directory: /path} or {s3: {endpoint, bucket, prefix, region}}; none "
        "(default): evidence stays on the bus")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _no_age(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("max_age", "max_bytes"):
                if key in data:
                    raise ValueError(f"evidence.{key} is not supported: sealed evidence never leaves the bus by age "
                                     f"or size (it would be the only copy); set evidence.archive to move it off "
                                     f"the bus at the seal")
        return data


class Retention(Strict):
    """What the bus keeps, with the defaults it always had (run history 30d, LOGS 14d, AUDIT 365d, evidence on the
    bus). K8S (7d), BACKEND (7d), NODES (3d) and DLQ (30d) are fixed: they hold no history a person reads back."""

    runs: RunsRetention = Field(default_factory=RunsRetention)
    logs: LogsRetention = Field(default_factory=LogsRetention)
    evidence: EvidenceRetention = Field(default_factory=EvidenceRetention)
    audit: AuditRetention = Field(default_factory=AuditRetention)

    @pydantic.model_validator(mode="after")
    def _audit_outlives_runs(self) -> Retention:
        if self.audit.max_age < self.runs.max_age:
            raise ValueError("audit.max_age is shorter than runs.max_age: AUDIT keeps of the runs' events what "
                             "`tau verify` checks against; make audit.max_age at least runs.max_age")
        return self

    def stream_limits(self) -> dict[str, tuple[float, int]]:
        """Stream name → (max_age seconds, max_bytes or -1) for the streams this setting governs. RUNS' limits are
        HISTORY's too (the bootstrap gives them to ``history_config``): RUNS keeps them as its bound on what its
        durables have not acked."""
        def size(v: str | None) -> int:
            return parse_memory(v) if v is not None else -1

        return {"RUNS": (self.runs.max_age, size(self.runs.max_bytes)),
                "LOGS": (self.logs.max_age, size(self.logs.max_bytes)),
                "AUDIT": (self.audit.max_age, -1)}
