"""W3C trace context through every hop, with opentelemetry-sdk.

No exporter by default (spans are still created so ``traceparent`` chains); set
``OTEL_EXPORTER_OTLP_ENDPOINT`` to export over OTLP/HTTP when the optional exporter is installed. Without an
exporter nothing would ever read a recorded span, so spans are then non-recording: the same trace id, a fresh
span id and the parent's flags, without the SDK's bookkeeping (it costs every message on every hop).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_configured = False
_exporting = False
_tracer: trace.Tracer | None = None
_IDS = RandomIdGenerator()


def setup(service: str) -> None:
    """Install a tracer provider once per process."""
    global _configured, _exporting
    if _configured:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"taugrid-{service}"}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            _exporting = True
        except ImportError:  # exporter is an optional extra: taugrid[otlp]
            pass
    trace.set_tracer_provider(provider)
    _configured = True


def tracer() -> trace.Tracer:
    # One per process: the global provider is set once, and before that this is a proxy that follows it.
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer("taugrid")
    return _tracer


@contextlib.contextmanager
def span(name: str, *, parent: str = "", kind: SpanKind = SpanKind.INTERNAL,
         attributes: dict[str, str] | None = None) -> Iterator[Span]:
    """A span that continues ``parent`` (a traceparent string) when given, else the current span's trace."""
    ctx = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
    if _configured and not _exporting:
        up = trace.get_current_span(ctx).get_span_context()
        own = SpanContext(
            trace_id=up.trace_id if up.is_valid else _IDS.generate_trace_id(), span_id=_IDS.generate_span_id(),
            is_remote=False, trace_flags=up.trace_flags if up.is_valid else TraceFlags(TraceFlags.SAMPLED),
        )
        quiet = NonRecordingSpan(own)
        token = context.attach(trace.set_span_in_context(quiet, ctx))
        try:
            yield quiet
        finally:
            context.detach(token)
        return
    with tracer().start_as_current_span(name, context=ctx, kind=kind, attributes=attributes or {}) as s:
        yield s


def current_traceparent() -> str:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


def trace_id(traceparent: str) -> str:
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else ""
