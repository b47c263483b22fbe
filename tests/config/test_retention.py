"""platform.yaml's ``retention``: defaults, every key honoured, every unsafe value refused with the fix."""

from __future__ import annotations

import pytest

from taugrid.config.platform import load_platform
from taugrid.config.retention import AUDIT_MAX_AGE_S, DAY, LOGS_MAX_AGE_S, RUNS_MAX_AGE_S
from taugrid.core.errors import ConfigError


def test_defaults_are_the_limits_the_bus_always_had() -> None:
    r = load_platform("{}\n").retention
    assert r.stream_limits() == {"RUNS": (RUNS_MAX_AGE_S, -1), "LOGS": (LOGS_MAX_AGE_S, -1),
                                 "AUDIT": (AUDIT_MAX_AGE_S, -1)}
    assert (RUNS_MAX_AGE_S, LOGS_MAX_AGE_S, AUDIT_MAX_AGE_S) == (30 * DAY, 14 * DAY, 365 * DAY)
    assert r.evidence.archive is None


def test_every_key_is_read() -> None:
    r = load_platform(
        "retention:\n"
        "  runs: {max_age: 7d, max_bytes: 1Gi}\n"
        "  logs: {max_age: 2d, max_bytes: 512Mi}\n"
        "  audit: {max_age: 90d}\n"
        "  evidence:\n"
        "    archive: {s3: {endpoint: 'https://s3.example:9000', bucket: tau-evidence, prefix: site-a/,"
        " region: eu-west-1}}\n"
    ).retention
    assert r.stream_limits() == {"RUNS": (7 * DAY, 1 << 30), "LOGS": (2 * DAY, 512 << 20), "AUDIT": (90 * DAY, -1)}
    assert r.evidence.archive is not None and r.evidence.archive.s3 is not None
    s3 = r.evidence.archive.s3
    assert (s3.endpoint, s3.bucket, s3.prefix, s3.region) == ("https://s3.example:9000", "tau-evidence", "site-a",
                                                               "eu-west-1")
    assert r.evidence.archive.where() == "s3://tau-evidence/site-a"
    d = load_platform("retention: {evidence: {archive: {directory: /var/lib/taugrid/archive}}}\n").retention
    assert d.evidence.archive is not None and d.evidence.archive.where() == "directory /var/lib/taugrid/archive"


@pytest.mark.parametrize(("text", "field", "fix"), [
    ("retention: {runs: {max_age: 2h}}", "retention.runs.max_age", "write at least 1d"),
    ("retention: {runs: {max_bytes: 1Mi}}", "retention.runs.max_bytes", "write at least 64Mi"),
    ("retention: {logs: {max_age: 10m}}", "retention.logs.max_age", "write at least 1h"),
    ("retention: {audit: {max_age: 10d}}", "retention:", "make audit.max_age at least runs.max_age"),
    ("retention: {audit: {max_bytes: 10Gi}}", "retention.audit", "bound AUDIT by audit.max_age"),
    ("retention: {evidence: {max_age: 30d}}", "retention.evidence", "set evidence.archive"),
    ("retention: {evidence: {archive: {}}}", "retention.evidence.archive", "{directory: /var/lib/taugrid/archive}"),
    ("retention: {evidence: {archive: {directory: archive}}}", "retention.evidence.archive.directory",
     "write the full path"),
    ("retention: {evidence: {archive: {s3: {bucket: tau, endpoint: 's3.local'}}}}",
     "retention.evidence.archive.s3.endpoint", "https://host:port"),
    ("retention: {evidence: {archive: {s3: {bucket: tau, prefix: 'a/../b'}}}}",
     "retention.evidence.archive.s3.prefix", "relative key prefix"),
    ("retention: {dlq: {max_age: 1d}}", "retention.dlq", "remove it"),
])
def test_refused_with_the_field_and_the_fix(text: str, field: str, fix: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_platform(text + "\n")
    assert field in str(err.value) and fix in str(err.value)
