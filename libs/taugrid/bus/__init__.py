"""NATS JetStream adapter, and nothing else: connection, bootstrap and topology, CloudEvents envelope, consumer
loop, KV/object/stream/replay helpers, DLQ, tracing and metrics of bus calls.

This package is the only one that imports nats-py (an import-linter contract holds it to that): every nats
exception is translated here (the classes named once, in ``errors``), so the rest of taugrid sees only
``taugrid.core.errors`` and the bus errors below. What only uses the bus lives elsewhere: the run record in
``taugrid.runrecord``, who may do what in ``taugrid.access``, source snapshots in ``taugrid.sources``.
KV access goes through ``kv`` (create-once, compare-and-set, one reader), objects through ``objects``, stored
messages through ``replay`` and ``streams``.

The package's own names load on first use (PEP 562), so importing a light submodule (``taugrid.bus.envelope``,
which the CLI's views need) does not import nats-py and its HTTP stack: ``tau --help`` and ``tau run validate``
stay cold-start fast.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from taugrid.core.errors import PermissionDenied

if TYPE_CHECKING:
    from taugrid.bus.connection import Bus, connect
    from taugrid.bus.envelope import Event
    from taugrid.bus.kv import Conflict

__all__ = ["Bus", "Conflict", "Event", "PermissionDenied", "connect"]

_LAZY = {"Bus": "taugrid.bus.connection", "connect": "taugrid.bus.connection", "Event": "taugrid.bus.envelope",
         "Conflict": "taugrid.bus.kv"}


class _NatsWithoutWebSocket(importlib.abc.MetaPathFinder):
    """Load ``nats.aio.transport`` with ``aiohttp`` hidden from it.

    nats-py imports aiohttp (when installed: kubernetes-asyncio brings it) at import time, only for its
    WebSocket transport (``ws://`` URLs), which taugrid never uses: it connects over ``nats://`` or ``tls://``.
    That import alone costs every process about 0.2 s of CPU at start and 11 MB of resident memory (measured
    with a fresh interpreter on this 2-core machine: nats-py alone 0.21 s / 25.5 MB, with aiohttp 0.40-0.52 s /
    36.4 MB). Only nats-py's module sees aiohttp as missing; a later ``import aiohttp`` (kubernetes-asyncio on
    the Kubernetes backend) imports it as usual. When aiohttp is already imported, nothing is hidden.
    """

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> Any:
        if fullname != "nats.aio.transport":
            return None
        sys.meta_path.remove(self)  # once: what follows finds the real module
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or "aiohttp" in sys.modules:
            return spec
        real = spec.loader

        class _Hiding(importlib.abc.Loader):
            def __getattr__(self, name: str) -> Any:  # get_source, get_filename, …: the real loader's
                return getattr(real, name)

            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return real.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                sys.modules["aiohttp"] = None  # type: ignore[assignment]  # ``import aiohttp`` raises ImportError
                try:
                    real.exec_module(module)
                finally:
                    if sys.modules.get("aiohttp", 0) is None:
                        del sys.modules["aiohttp"]

        spec.loader = _Hiding()
        return spec


if "nats.aio.transport" not in sys.modules and not any(isinstance(f, _NatsWithoutWebSocket) for f in sys.meta_path):
    sys.meta_path.insert(0, _NatsWithoutWebSocket())


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'taugrid.bus' has no attribute {name!r}")
