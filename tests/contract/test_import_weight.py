"""The embedded stack's services (the local backend) start without the Kubernetes client.

kubernetes_asyncio's generated models are about 65 MB resident per process; only the Kubernetes backend needs
them (kube-bridge, the health monitor's actuator). Nor do they import prometheus_client or the OpenTelemetry SDK
where nothing would read what they make (issue 27: about 3.5 MB resident per service together, with the
http.server, wsgiref and psutil modules they bring). Memory targets themselves are measured in bench/pipeline.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from taugrid.stack.scaling import SERVICES

# Only the client: taugrid.kube.translate is pure and shared with the local backend, and the renderer validates
# manifests with kubernetes-validate on every backend.
KUBERNETES_ONLY = ("kubernetes_asyncio",)


def _first_loading_each(modules: list[str], watched: tuple[str, ...] = KUBERNETES_ONLY) -> dict[str, list[str]]:
    """Import each module in turn in one fresh interpreter; which of the ``watched`` modules each one added."""
    probe = (
        "import importlib, sys\n"
        "seen = set()\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"    new = [m for m in {watched!r} if m in sys.modules and m not in seen]\n"
        "    seen.update(new)\n"
        "    print(name, *new)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TAU_BACKEND"}  # the default: local
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env).stdout
    return {line.split()[0]: line.split()[1:] for line in out.splitlines()}


# Imported only where used: prometheus_client where a service serves /metrics (``metrics.record``), the SDK where
# spans are exported (``tracing.setup`` with OTEL_EXPORTER_OTLP_ENDPOINT set).
ONLY_WHERE_READ = ("prometheus_client", "opentelemetry.sdk")


def _after_start(*, metrics_port: bool, endpoint: bool) -> list[str]:
    """What a service's start and hot paths do with metrics and tracing (``taugrid.service.run``, a consumer, a KV
    operation, a span), in a fresh interpreter: which of the modules that only a reader needs it then holds, and
    the handled-event count the default registry shows ("-" where prometheus_client was not imported)."""
    probe = (
        "import sys\n"
        "from taugrid.bus import metrics, tracing\n"
        "tracing.setup('probe')\n"
        f"metrics.record({metrics_port})\n"
        "with metrics.timed(metrics.KV_SECONDS, 'submissions', 'get'):\n"
        "    pass\n"
        "metrics.child(metrics.HANDLED, 'probe', 'submit.accepted', 'ack').observe(0.01)\n"
        "metrics.DEAD_LETTERS.labels('probe', 'refused').inc()\n"
        f"if not {endpoint}:  # no span where it could be exported: the exporter, if installed, would send it\n"
        "    with tracing.span('handle', parent='00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'):\n"
        "        assert tracing.current_traceparent().endswith('-00f067aa0ba902b7-01')\n"
        "count = '-'\n"
        "if 'prometheus_client' in sys.modules:\n"
        "    from prometheus_client import REGISTRY\n"
        "    count = REGISTRY.get_sample_value('taugrid_handler_seconds_count', {'durable': 'probe', "
        "'event_type': 'submit.accepted', 'outcome': 'ack'})\n"
        f"print(count, *[m for m in {(*ONLY_WHERE_READ, 'http.server', 'psutil')!r} if m in sys.modules])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OTEL_EXPORTER_OTLP_ENDPOINT"}
    if endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"  # never reached: no span is made
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env=env).stdout.split()


def test_no_embedded_service_imports_metrics_or_the_tracing_sdk_at_start() -> None:
    modules = [f"taugrid_services.{svc}.__main__" for svc in SERVICES]
    assert _first_loading_each(modules, ONLY_WHERE_READ) == {name: [] for name in modules}


def test_a_service_without_a_metrics_port_or_an_exporter_records_nothing_and_imports_neither() -> None:
    assert _after_start(metrics_port=False, endpoint=False) == ["-"]


def test_a_metrics_port_and_an_exporter_bring_what_they_need() -> None:
    """The probe sees the modules once they are used: each event handled is counted, as before."""
    assert _after_start(metrics_port=True, endpoint=True) == [
        "1.0", "prometheus_client", "opentelemetry.sdk", "http.server", "psutil"]


def test_services_import_neither_a_command_line_parser_nor_difflib_at_start() -> None:
    """argparse (with gettext, about 0.4 MB resident) serves only ``python -m taugrid.bus.bootstrap``'s command
    line, difflib (about 0.2 MB) only a platform mistake's "did you mean". The portal's aiohttp.web imports argparse
    itself: the probe sees it there."""
    modules = [f"taugrid_services.{svc}.__main__" for svc in SERVICES]
    portal = "taugrid_services.portal.__main__"
    assert _first_loading_each(modules, ("argparse", "difflib")) == {
        name: ["argparse"] if name == portal else [] for name in modules}


def test_a_service_reading_a_valid_platform_imports_no_difflib() -> None:
    """The platform's cross-checks guess a name (difflib) only for a mistake: a valid platform, as every service
    reads one, leaves it out; a misspelt name brings it (the probe sees it)."""
    platform = (
        "resource_flavors: [{name: default}]\n"
        "cluster_queues: [{name: team, resource_groups: [{covered_resources: [cpu], flavors: [{name: default, "
        "resources: [{name: cpu, nominal_quota: '8'}]}]}]}]\n"
        "local_queues: [{name: team, namespace: default, cluster_queue: %s}]\n"
    )
    probe = (
        "import sys\n"
        "from taugrid.config.platform import load_platform_kept\n"
        "from taugrid.core.errors import ConfigError\n"
        "try:\n"
        "    load_platform_kept(sys.argv[1])\n"
        "except ConfigError as exc:\n"
        "    print('refused:', 'did you mean' in str(exc))\n"
        "print('difflib' in sys.modules)\n"
    )
    seen = [subprocess.run([sys.executable, "-c", probe, platform % name], capture_output=True, text=True,
                           check=True).stdout.split() for name in ("team", "teem")]
    assert seen == [["False"], ["refused:", "True", "True"]]


def test_no_embedded_service_imports_the_kubernetes_client_at_start() -> None:
    modules = [f"taugrid_services.{svc}.__main__" for svc in SERVICES]
    assert _first_loading_each(modules) == {name: [] for name in modules}


def test_the_probe_sees_the_kubernetes_client_when_it_is_imported() -> None:
    """The checks here would pass vacuously if the probe could not see these modules. It also shows aiohttp,
    hidden from nats-py's module only (below), imported as usual by the Kubernetes client after the bus."""
    watched = (*KUBERNETES_ONLY, "aiohttp")
    assert _first_loading_each(["taugrid.bus.connection", "taugrid.kube.nodes"], watched) == {
        "taugrid.bus.connection": [], "taugrid.kube.nodes": list(watched)}


def test_services_connect_without_nats_py_loading_aiohttp() -> None:
    """nats-py imports aiohttp (about 11 MB and 0.2 s of CPU per process) only for WebSocket URLs, which taugrid
    does not use: ``taugrid.bus`` hides it from nats-py. Only the portal, whose HTTP server it is, imports it."""
    modules = [f"taugrid_services.{svc}.__main__" for svc in SERVICES if svc != "portal"]
    modules += ["taugrid.bus.consumer", "taugrid.bus.replay", "taugrid.client"]
    assert _first_loading_each(modules, ("aiohttp",)) == {name: [] for name in modules}


def test_only_the_renderer_loads_the_manifest_schema_validator() -> None:
    """jsonschema, kubernetes_validate and the run config models come with the ``taugrid.render`` package (about
    4 MB resident); the local cluster reads only the names renderer and backend share (``core.manifestkeys``)."""
    modules = [f"taugrid_services.{svc}.__main__" for svc in SERVICES if svc != "renderer"]
    assert _first_loading_each(modules, ("taugrid.render", "jsonschema")) == {name: [] for name in modules}
    renderer = "taugrid_services.renderer.__main__"
    assert _first_loading_each([renderer], ("taugrid.render", "jsonschema")) == {
        renderer: ["taugrid.render", "jsonschema"]}  # the probe sees them where they are imported


async def test_a_websocket_url_is_refused_with_what_to_use_instead() -> None:
    from taugrid.bus.connection import connect
    from taugrid.core.errors import PermanentError

    with pytest.raises(PermanentError, match=r"ws://127.0.0.1:1: taugrid connects over nats:// or tls://"):
        await connect("ws://127.0.0.1:1", name="probe")


def test_gpu_discovery_imports_pynvml_only_where_the_nvml_library_loads() -> None:
    """``import pynvml`` alone is about 17 MB resident; the local cluster's inventory and the node agent's
    probe check for the driver's library first."""
    probe = (
        "import sys\n"
        "from taugrid.health.nvml import NvmlProbe\n"
        "from taugrid.gpulib import nvml_library_missing\n"
        "from taugrid.local.machine import inventory\n"
        "gpus = inventory().gpus\n"
        "sample = NvmlProbe().sample('n')\n"
        "print(bool(nvml_library_missing()), 'pynvml' in sys.modules, gpus, sample.gpu_source, sample.message)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TAU_DECLARED_GPUS"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env).stdout
    missing, imported, gpus, source, message = out.split(maxsplit=4)
    if missing == "True":  # this machine, without the NVIDIA driver
        assert (imported, gpus, source) == ("False", "0", "none")
        assert message.startswith("no GPUs: NVML did not initialise: NVML Shared Library Not Found (")
    else:  # the driver's library is here: NVML is asked, as before
        assert imported == "True"
