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
from opentelemetry.context import Context
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
    if _configured and not _exporting:
        remote = _remote(parent) if parent else None
        if remote is not None:  # the common case, read without the propagator's regular expressions
            ctx: Context | None = Context()
            up = remote
        else:
            ctx = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
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
    ctx = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
    with tracer().start_as_current_span(name, context=ctx, kind=kind, attributes=attributes or {}) as s:
        yield s


_HEX = frozenset("0123456789abcdef")


def _remote(traceparent: str) -> SpanContext | None:
    """A plain version-00 ``traceparent`` read as the propagator reads it (a remote span context), or None for
    any other form, which then goes through the propagator itself: every odd header is read exactly as before."""
    parts = traceparent.split("-")
    if (len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2
            or not _HEX.issuperset(parts[1] + parts[2] + parts[3])):
        return None
    trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True, trace_flags=TraceFlags(int(parts[3], 16)))


def current_traceparent() -> str:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


def trace_id(traceparent: str) -> str:
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else ""
