"""W3C trace context through every hop, with opentelemetry-sdk.

No exporter by default; set ``OTEL_EXPORTER_OTLP_ENDPOINT`` to export over OTLP/HTTP when the optional exporter
is installed. Without an exporter nothing would ever read a span, so a service (``setup``) then makes none: a
``span`` only carries the ``traceparent`` it continues (its ``parent``, else the enclosing one, else a new root
with a fresh trace id) in a context variable, and what is published inside it carries that ``traceparent``
unchanged: every event of a run keeps its trace id without any OpenTelemetry work per message on every hop. With
an exporter (or in a process that never called ``setup``: the API's no-op tracer) spans go through OpenTelemetry.
The SDK (its tracer provider, and the resource detection that imports psutil) is imported only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: without it the provider would make no span (issue 27: about 2 MB resident
in every service).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_configured = False
_exporting = False
_tracer: trace.Tracer | None = None
# The traceparent the current ``span`` carries when no exporter is configured ("" outside any span).
_CARRIED: ContextVar[str] = ContextVar("taugrid_traceparent", default="")


def setup(service: str) -> None:
    """Once per process: spans only carry their traceparent from now on, unless ``OTEL_EXPORTER_OTLP_ENDPOINT``
    is set; then the SDK's tracer provider is installed, exporting over OTLP when the exporter is installed."""
    global _configured, _exporting
    if _configured:
        return
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        _exporting = _provide(service)
    _configured = True


def _provide(service: str) -> bool:
    """Install the SDK's tracer provider; whether it exports."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=Resource.create({"service.name": f"taugrid-{service}"}))
    exporting = False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        exporting = True
    except ImportError:  # exporter is an optional extra: taugrid[otlp]
        pass
    trace.set_tracer_provider(provider)
    return exporting


def tracer() -> trace.Tracer:
    # One per process: the global provider is set once, and before that this is a proxy that follows it.
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer("taugrid")
    return _tracer


class _Carry:
    """The span of a process without an exporter: its traceparent in ``_CARRIED`` while it is entered. A class, not
    a generator: every message every service handles or publishes opens one (issue 30)."""

    __slots__ = ("carried", "token")

    def __init__(self, carried: str) -> None:
        self.carried = carried
        self.token: Token[str] | None = None

    def __enter__(self) -> Span:
        self.token = _CARRIED.set(self.carried)
        return INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _CARRIED.reset(self.token)


def span(name: str, *, parent: str = "", kind: SpanKind = SpanKind.INTERNAL,
         attributes: dict[str, str] | None = None, root: str = "") -> AbstractContextManager[Span]:
    """A span that continues ``parent`` (a traceparent string) when given, else the current span's trace, else
    ``root`` when given (a client's submission: its run's ``envelope.run_traceparent``, which every event of the
    run then carries and the bus need not store), else a new trace. With an exporter the span is a child of
    ``root``: the run's trace id, a span id of its own."""
    if _configured and not _exporting:
        return _Carry(_carried(parent) if parent else (_CARRIED.get() or root or _root()))
    if not parent and root and not trace.get_current_span().get_span_context().is_valid:
        parent = root
    return _exported(name, parent=parent, kind=kind, attributes=attributes)


@contextlib.contextmanager
def _exported(name: str, *, parent: str, kind: SpanKind, attributes: dict[str, str] | None) -> Iterator[Span]:
    ctx = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
    with tracer().start_as_current_span(name, context=ctx, kind=kind, attributes=attributes or {}) as s:
        yield s


_HEX = frozenset("0123456789abcdef")


_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _plain(traceparent: str) -> bool:
    """Whether ``_remote`` reads ``traceparent`` (a plain version-00 one naming a span), without building it."""
    return (len(traceparent) == 55 and traceparent[2] == "-" and traceparent[35] == "-" and traceparent[52] == "-"
            and traceparent[:2] == "00" and _HEX.issuperset(traceparent[3:35]) and _HEX.issuperset(traceparent[36:52])
            and _HEX.issuperset(traceparent[53:]) and traceparent[3:35] != _ZERO_TRACE
            and traceparent[36:52] != _ZERO_SPAN)


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


def _root() -> str:
    """A new trace's traceparent (sampled, as the SDK's default sampler decides for a root)."""
    return f"00-{random.getrandbits(128) or 1:032x}-{random.getrandbits(64) or 1:016x}-01"


def _carried(parent: str) -> str:
    """``parent`` when it is a plain version-00 traceparent; any other form read by the propagator and written as
    one; a new root when it names no valid span (as the SDK starts a new trace then)."""
    if _plain(parent):
        return parent
    up = trace.get_current_span(_PROPAGATOR.extract({"traceparent": parent})).get_span_context()
    if not up.is_valid:
        return _root()
    return f"00-{up.trace_id:032x}-{up.span_id:016x}-{int(up.trace_flags):02x}"


def current_traceparent() -> str:
    carried = _CARRIED.get()
    if carried:
        return carried
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


def trace_id(traceparent: str) -> str:
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else ""
