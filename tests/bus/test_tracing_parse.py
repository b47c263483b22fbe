"""The quick ``traceparent`` reading gives the span context the OpenTelemetry propagator gives, or defers to it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from taugrid.bus import tracing
from taugrid.bus.envelope import run_traceparent

PROPAGATOR = TraceContextTextMapPropagator()
GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _reference(traceparent: str) -> trace.SpanContext:
    return trace.get_current_span(PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()


@pytest.mark.parametrize("traceparent", [
    GOOD, GOOD[:-2] + "00", GOOD[:-2] + "ff", "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", GOOD.upper(), "01" + GOOD[2:] + "-extra",
    "ff" + GOOD[2:], "garbage", GOOD + "-", GOOD.replace("-", "_"),
])
def test_same_span_context_as_the_propagator_or_none(traceparent: str) -> None:
    mine, ref = tracing._remote(traceparent), _reference(traceparent)
    assert tracing._plain(traceparent) == (mine is not None)
    if mine is not None:
        assert ref.is_valid and (mine.trace_id, mine.span_id, mine.trace_flags, mine.is_remote) == (
            ref.trace_id, ref.span_id, ref.trace_flags, ref.is_remote)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789abcdefABX-", max_size=60))
def test_never_reads_what_the_propagator_would_not(traceparent: str) -> None:
    mine = tracing._remote(traceparent)
    assert tracing._plain(traceparent) == (mine is not None)
    if mine is not None:
        ref = _reference(traceparent)
        assert ref.is_valid and (mine.trace_id, mine.span_id, mine.trace_flags) == (
            ref.trace_id, ref.span_id, ref.trace_flags)


def test_without_an_exporter_a_span_carries_its_parents_traceparent_unchanged() -> None:
    tracing.setup("test")
    assert tracing.current_traceparent() == ""  # outside any span: nothing to carry
    with tracing.span("x", parent=GOOD):
        assert tracing.current_traceparent() == GOOD
        with tracing.span("publish"):  # a nested span continues the enclosing one
            assert tracing.current_traceparent() == GOOD
        with tracing.span("y", parent="01" + GOOD[2:] + "-extra"):  # a later version, written as version 00
            assert tracing.current_traceparent() == GOOD
    assert tracing.current_traceparent() == ""
    with tracing.span("root"):  # no parent: a new trace, which a nested span keeps
        root = tracing.current_traceparent()
        assert tracing._remote(root) is not None and root.split("-")[1] != GOOD.split("-")[1]
        with tracing.span("publish"):
            assert tracing.current_traceparent() == root
    with tracing.span("bad", parent="garbage"):  # names no span: a new trace, as the SDK starts one
        fresh = tracing.current_traceparent()
        assert tracing._remote(fresh) is not None and fresh != root
    with pytest.raises(KeyError), tracing.span("failing", parent=GOOD):  # a handler's error goes through
        raise KeyError("x")
    assert tracing.current_traceparent() == ""  # and the span is left all the same


def _as_with_an_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``setup`` leaves a process where ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: the SDK's tracer provider
    installed (OpenTelemetry takes one per process) and spans made through it."""
    from opentelemetry.sdk.trace import TracerProvider

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    monkeypatch.setattr(tracing, "_exporting", True)


def test_with_an_exporter_spans_go_through_opentelemetry_and_current_traceparent_matches_inject(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tracing.setup("test")
    _as_with_an_exporter(monkeypatch)
    with tracing.span("x", parent=GOOD):
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier)
        assert tracing.current_traceparent() == carrier["traceparent"]
        assert carrier["traceparent"].split("-")[1] == GOOD.split("-")[1]
        assert carrier["traceparent"].split("-")[2] != GOOD.split("-")[2]  # a span of its own


def test_a_span_outside_any_trace_starts_at_its_root_and_a_trace_of_the_callers_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's submission (``root``: its run's derived traceparent) starts the run's trace there unless it is
    made inside a trace of the caller's own (a parent, an enclosing span), which its events then carry."""
    root = run_traceparent("hello-3f2a9c")
    tracing.setup("test")
    with tracing.span("tau run", root=root):
        assert tracing.current_traceparent() == root
    with tracing.span("driver", parent=GOOD), tracing.span("tau run", root=root):
        assert tracing.current_traceparent() == GOOD
    with tracing.span("tau run", parent=GOOD, root=root):
        assert tracing.current_traceparent() == GOOD
    _as_with_an_exporter(monkeypatch)  # a span of its own, in the run's trace
    with tracing.span("tau run", root=root):
        carried = tracing.current_traceparent()
        assert carried.split("-")[1] == root.split("-")[1] and carried != root
    with tracing.span("driver", parent=GOOD), tracing.span("tau run", root=root):
        assert tracing.current_traceparent().split("-")[1] == GOOD.split("-")[1]
