"""W3C trace context through every hop, with opentelemetry-sdk.

No exporter by default (spans are still created so ``traceparent`` chains); set
``OTEL_EXPORTER_OTLP_ENDPOINT`` to export over OTLP/HTTP when the optional exporter is installed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_configured = False


def setup(service: str) -> None:
    """Install a tracer provider once per process."""
    global _configured
    if _configured:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"taugrid-{service}"}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        except ImportError:  # exporter is an optional extra: taugrid[otlp]
            pass
    trace.set_tracer_provider(provider)
    _configured = True


def tracer() -> trace.Tracer:
    return trace.get_tracer("taugrid")


@contextlib.contextmanager
def span(name: str, *, parent: str = "", kind: SpanKind = SpanKind.INTERNAL,
         attributes: dict[str, str] | None = None) -> Iterator[Span]:
    """A span that continues ``parent`` (a traceparent string) when given, else the current span's trace."""
    ctx = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
    with tracer().start_as_current_span(name, context=ctx, kind=kind, attributes=attributes or {}) as s:
        yield s


def current_traceparent() -> str:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


def trace_id(traceparent: str) -> str:
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else ""
