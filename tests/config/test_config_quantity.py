"""core.quantity: the parsers tau.yaml and platform.yaml share."""

import pytest

from taugrid.core.quantity import format_cpu, format_memory, parse_cpu, parse_duration, parse_memory


@pytest.mark.parametrize(("text", "cores"), [(2, 2.0), ("2", 2.0), ("1.5", 1.5), ("500m", 0.5), (0.25, 0.25)])
def test_parses_cpu_as_cores(text, cores):
    assert parse_cpu(text) == cores


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64Gi", 64 << 30),
        ("512Mi", 512 << 20),
        ("1G", 10**9),
        (1024, 1024),
        ("1.5Gi", 3 << 29),
        ("1e3", 1000),
    ],
)
def test_parses_memory_as_bytes(text, size):
    assert parse_memory(text) == size


@pytest.mark.parametrize("bad", ["4x", "", "Gi", "-1", True, "1 Gi Gi"])
def test_rejects_malformed_quantities(bad):
    with pytest.raises(ValueError):
        parse_memory(bad)


def test_formats_memory_in_the_largest_exact_unit():
    assert format_memory(64 << 30) == "64Gi"
    assert format_memory(1536 << 20) == "1536Mi"
    assert format_memory(1500) == "1500"
    assert format_cpu(0.5) == "500m" and format_cpu(16.0) == "16"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        (90, 90),
        ("90", 90),
        ("1h30m", 5400),
        ("2d", 172800),
        ("250ms", 0.25),
    ],
)
def test_parses_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "m5", "-3", True, "1h-5m"])
def test_rejects_malformed_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)
