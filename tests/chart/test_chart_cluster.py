"""`nats.cluster.replicas: 3`: the chart's embedded NATS as a 3-server JetStream cluster.

The rendered objects are checked field by field and validated against the Kubernetes schemas; the rendered
`nats.conf` is then run as three real nats-servers (the pod's addresses mapped onto loopback ports, nothing else
changed), and the chart's bootstrap command creates every stream on all three of them."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from taugrid.bus import connect
from taugrid.bus.bootstrap import main as bootstrap_main
from taugrid.bus.topology import STREAMS
from taugrid.core.errors import TauError
from taugrid.ports import free_port
from taugrid.stack import natsserver

from .test_chart import CHART, K8S_VERSION, Render, find, helm, one, render  # noqa: F401 - fixtures
from .test_chart_bus import make_certs
from .tools import tool

R3 = ("nats.cluster.replicas=3", "auth.enabled=false", "sourceFetch.credsSecret=")


def test_three_replicas_make_a_statefulset_of_three_routed_servers(render: Render) -> None:  # noqa: F811
    objs = render("nats.cluster.replicas=3")
    sts = one(objs, "StatefulSet", "t-taugrid-nats")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    nats = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "nats")
    assert {"name": "cluster", "containerPort": 6222} in nats["ports"]
    anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == (
        "kubernetes.io/hostname")
    conf = one(objs, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    routes = [f"nats://t-taugrid-nats-{i}.t-taugrid-nats-headless.taugrid.svc:6222" for i in range(3)]
    assert all(r in conf for r in routes) and "listen: 0.0.0.0:6222" in conf and "no_advertise: true" in conf
    headless = one(objs, "Service", "t-taugrid-nats-headless")
    assert headless["spec"]["publishNotReadyAddresses"] is True  # routes form before the servers are ready
    assert {"name": "cluster", "port": 6222, "targetPort": "cluster"} in headless["spec"]["ports"]
    pdb = one(objs, "PodDisruptionBudget", "t-taugrid-nats")
    assert pdb["spec"]["maxUnavailable"] == 1
    policy = one(objs, "NetworkPolicy", "t-taugrid-nats")
    route_rules = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": 6222}]]
    assert route_rules == [{"from": [{"podSelector": {"matchLabels": sts["spec"]["selector"]["matchLabels"]}}],
                            "ports": [{"port": 6222}]}]
    job = one(objs, "Job", "t-taugrid-bootstrap")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "taugrid.bus.bootstrap", "--replicas", "3",
                                    "--service-keys", "/etc/taugrid/identities/identities.json"]
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_one_replica_renders_no_cluster(render: Render) -> None:  # noqa: F811
    objs = render()
    assert "cluster {" not in one(objs, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    assert one(objs, "StatefulSet", "t-taugrid-nats")["spec"]["replicas"] == 1
    assert not [p for p in find(objs, "PodDisruptionBudget") if p["metadata"]["name"] == "t-taugrid-nats"]
    (container,) = one(objs, "Job", "t-taugrid-bootstrap")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "taugrid.bus.bootstrap", "--replicas", "1",
                                    "--service-keys", "/etc/taugrid/identities/identities.json"]


@pytest.mark.parametrize("bad", ["nats.cluster.replicas=2", "nats.cluster.replicas=7", "nats.cluster.size=3"])
def test_an_even_or_too_large_cluster_fails_the_schema(bad: str) -> None:
    proc = subprocess.run([str(tool("helm")), "template", "t", str(CHART), "--set", bad], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "don't meet the specifications of the schema" in proc.stderr, proc.stderr


def cluster_confs(root: Path) -> tuple[list[Path], list[int]]:
    """The rendered nats.conf of each of the three pods, their addresses mapped onto loopback ports and the TLS
    Secret's mount onto ``root/tls`` (a certificate for localhost, as the chart's generated one is for the
    Service's name)."""
    make_certs(root / "tls")
    args = [str(tool("helm")), "template", "t", str(CHART), "--namespace", "taugrid", "--kube-version", K8S_VERSION]
    for s in R3:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    text = one([d for d in yaml.safe_load_all(out) if d], "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    clients, routes, monitors = ([free_port() for _ in range(3)] for _ in range(3))
    confs = []
    for i in range(3):
        mine = text
        for j in range(3):
            pod = f"t-taugrid-nats-{j}.t-taugrid-nats-headless.taugrid.svc:6222"
            mine = mine.replace(pod, f"127.0.0.1:{routes[j]}")
        for pod_addr, here in [("0.0.0.0:4222", f"127.0.0.1:{clients[i]}"),
                               ("0.0.0.0:8222", f"127.0.0.1:{monitors[i]}"),
                               ("0.0.0.0:6222", f"127.0.0.1:{routes[i]}"),
                               ("store_dir: /data", f"store_dir: {root}/d{i}"),
                               ('"/etc/nats-tls/', f'"{root}/tls/')]:
            assert pod_addr in mine, pod_addr
            mine = mine.replace(pod_addr, here)
        conf = root / f"nats-{i}.conf"
        conf.write_text(mine)
        confs.append(conf)
    return confs, clients


def _tails(root: Path) -> str:
    """The end of each server's log, for a failure's message."""
    return "\n".join(f"--- nats-{i}.log\n" + (root / f"nats-{i}.log").read_text(errors="replace")[-1500:]
                     for i in range(3) if (root / f"nats-{i}.log").exists())


async def test_the_rendered_cluster_forms_and_the_bootstrap_puts_every_stream_on_three_servers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The loopback ports are probed free, then bound by the servers: a port another process takes in between (a
    # parallel test's server, an outgoing connection's local port) leaves a server that never started, and the
    # cluster never formed (a CI run of session 25). Such a start is made again on fresh ports, at most twice.
    for attempt in range(3):
        root = tmp_path / f"start-{attempt}"
        confs, ports = cluster_confs(root)
        monkeypatch.setenv("TAU_NATS_CA", str(root / "tls" / "ca.crt"))  # the servers require TLS (the default)
        procs = [subprocess.Popen([natsserver.binary(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                                  stderr=open(root / f"nats-{i}.log", "ab"),  # noqa: SIM115 - the child owns it
                                  env={**os.environ, "POD_NAME": f"t-taugrid-nats-{i}"})
                 for i, conf in enumerate(confs)]
        try:
            try:
                for p in ports:
                    natsserver.wait_port(p)
            except TauError:
                if all(proc.poll() is None for proc in procs):
                    raise
            await asyncio.sleep(0.5)  # a server that could not bind its route or monitoring port exits by now
            if any(proc.poll() is not None for proc in procs):
                continue
            await _bootstrapped_on_three(",".join(f"nats://127.0.0.1:{p}" for p in ports), root)
            return
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    pytest.fail(f"no start of the three servers kept them all running:\n{_tails(root)}")


async def _bootstrapped_on_three(url: str, root: Path) -> None:
    for _ in range(90):  # until the servers elect a JetStream meta leader
        try:
            code = await asyncio.to_thread(bootstrap_main, [url, "--replicas", "3"])
            break
        except Exception:  # noqa: BLE001 - JetStream not ready yet
            await asyncio.sleep(1.0)
    else:
        pytest.fail(f"the bootstrap never succeeded on the rendered cluster:\n{_tails(root)}")
    assert code == 0
    bus = await connect(url, name="check")
    try:
        for name in [s.name for s in STREAMS] + ["AUDIT", "KV_run_state", "OBJ_sources"]:
            info = await bus.js.stream_info(name)
            assert info.config.num_replicas == 3, name
            assert info.cluster is not None and info.cluster.leader, name
            assert {info.cluster.leader, *(r.name for r in info.cluster.replicas or [])} == {
                f"t-taugrid-nats-{i}" for i in range(3)}, name
    finally:
        await bus.close()
