"""Many clusters on Kubernetes (docs §13d): a control-plane release whose platform names clusters is the hub (the
dispatcher runs, the renderer sends every run to it, NATS has JetStream domain `hub` and a leaf port whose users
are each site's leaf node with the grant `tau up` gives it), and `site.enabled` installs a worker cluster's site
(a leaf nats-server of its own domain linked to the hub as `leaf-<cluster>`, and the site's services against it).

Both modes are rendered with the real `helm` and every object validated against the Kubernetes schemas; then the
two rendered `nats.conf`s run as real servers (the pods' paths and addresses mapped into a temp dir, the env the
kubelet would expand, nothing else changed), with users from `chartauth`, linked as hub and leaf, and a report
and a request each cross the link as the sourced streams `taugrid.bus.sites` provisions."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from taugrid.access import permissions
from taugrid.bus import connect
from taugrid.bus import sites as bus_sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.platformstore import get_text
from taugrid.cli.main import cli
from taugrid.core.errors import PermanentError
from taugrid.ports import free_port
from taugrid.stack import chartauth, chartsites, natsserver

from .test_chart import CHART, K8S_VERSION, Obj, Render, env_of, find, helm, one, render
from .test_chart_bus import make_certs
from .tools import tool

__all__ = ["helm", "render"]  # the module-scoped fixtures of test_chart.py, shared

HUB = ("platform.enabled=true", "platform.config.clusters[0].name=west",
       "platform.config.clusters[0].backend=kubernetes", "platform.config.clusters[1].name=east",
       "platform.config.clusters[1].backend=kubernetes")
SITE = ("site.enabled=true", "site.cluster=west", "site.hub.address=hub.example.org:7422",
        "site.hub.tls.caSecret=hub-ca", *HUB)  # a site is given the hub's platform
LEAVES = "/etc/taugrid/leaves/leaves.json"


def _template(*sets: str, namespace: str = "taugrid") -> list[Obj]:
    args = [str(tool("helm")), "template", "t", str(CHART), "--namespace", namespace, "--kube-version", K8S_VERSION]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _validate(objs: list[Obj]) -> None:
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def _deployments(objs: list[Obj]) -> dict[str, Obj]:
    return {d["metadata"]["name"].removeprefix("t-taugrid-"): d for d in find(objs, "Deployment")}


def test_a_hub_runs_the_dispatcher_and_listens_for_its_sites(render: Render) -> None:
    objs = render(*HUB)
    _validate(objs)
    deps = _deployments(objs)
    # kube-bridge and log-shipper: no run goes to the hub's own cluster (a site release there makes it a worker)
    assert set(deps) == {"submitter", "run-record", "policy", "renderer", "admission-watcher", "health-monitor",
                         "recovery", "evidence", "portal", "anchor", "dispatcher"}
    spec = deps["dispatcher"]["spec"]["template"]["spec"]
    (dispatcher,) = spec["containers"]
    assert dispatcher["command"] == ["python", "-m", "taugrid_services.dispatcher"]
    assert spec["automountServiceAccountToken"] is False  # it talks to the bus only
    assert spec["serviceAccountName"] == "t-taugrid-dispatcher" and one(objs, "ServiceAccount", "t-taugrid-dispatcher")
    bus_creds = next(v for v in spec["volumes"] if v["name"] == "bus-creds")
    assert bus_creds["secret"]["items"] == [{"key": "svc-dispatcher.nk", "path": "creds"}]  # its own grant, §13a
    assert env_of(dispatcher)["TAU_CLUSTER"] == "default" and "TAU_SITE" not in env_of(dispatcher)
    renderer = deps["renderer"]["spec"]["template"]["spec"]["containers"][0]
    assert env_of(renderer)["TAU_CLUSTER"] == "dispatch"  # every run goes to the dispatcher, as `tau up` does
    conf = one(objs, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    assert "  domain: hub\n" in conf
    assert ('leafnodes {\n  listen: 0.0.0.0:7422\n  tls {\n    cert_file: "/etc/nats-tls/tls.crt"\n'
            '    key_file: "/etc/nats-tls/tls.key"\n  }\n}\n') in conf
    job = one(objs, "Job", "t-taugrid-bootstrap")["spec"]["template"]["spec"]
    assert [c["name"] for c in job["initContainers"]] == ["bus-bootstrap", "sites"]
    assert job["initContainers"][1]["command"] == ["python", "-m", "taugrid.stack.chartsites", "hub", "--platform",
                                                   "/etc/taugrid/platform/platform.yaml"]
    assert [m["name"] for m in job["initContainers"][1]["volumeMounts"]] == ["tmp", "bus-creds", "nats-ca",
                                                                            "platform"]
    sts = one(objs, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"]
    (init,) = sts["initContainers"]
    assert init["command"][-2:] == ["--leaves", LEAVES]
    sync = next(c for c in sts["containers"] if c["name"] == "auth-sync")
    assert sync["command"][sync["command"].index("--leaves") + 1] == LEAVES
    assert {"name": "leaves", "mountPath": "/etc/taugrid/leaves", "readOnly": True} in init["volumeMounts"]
    assert {"name": "leaves", "mountPath": "/etc/taugrid/leaves", "readOnly": True} in sync["volumeMounts"]
    leaves = next(v for v in sts["volumes"] if v["name"] == "leaves")
    assert leaves["secret"] == {"secretName": "taugrid-leaves", "defaultMode": 288,
                                "items": [{"key": "leaves.json", "path": "leaves.json"}]}
    assert {"name": "leafnodes", "containerPort": 7422} in sts["containers"][0]["ports"]
    assert {"name": "leafnodes", "port": 7422, "targetPort": "leafnodes"} in one(
        objs, "Service", "t-taugrid-nats")["spec"]["ports"]
    assert {"ports": [{"port": 7422}]} in one(objs, "NetworkPolicy", "t-taugrid-nats")["spec"]["ingress"]
    assert not find(objs, "Service", "t-taugrid-nats-leafnodes")
    exposed = render(*HUB, "clusters.external.enabled=true", "clusters.allowedFrom[0].ipBlock.cidr=10.9.0.0/16")
    _validate(find(exposed, "Service", "t-taugrid-nats-leafnodes") + find(exposed, "NetworkPolicy", "t-taugrid-nats"))
    svc = one(exposed, "Service", "t-taugrid-nats-leafnodes")["spec"]
    assert svc["type"] == "LoadBalancer" and svc["ports"] == [{"name": "leafnodes", "port": 7422,
                                                                 "targetPort": "leafnodes"}]
    assert {"ports": [{"port": 7422}], "from": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]} in one(
        exposed, "NetworkPolicy", "t-taugrid-nats")["spec"]["ingress"]


def test_without_clusters_no_dispatcher_no_domain_no_leaf_port(render: Render) -> None:
    objs = render("platform.enabled=true", "platform.config.queues[0].name=q")
    assert "dispatcher" not in _deployments(objs)
    assert [c["name"] for c in one(objs, "Job", "t-taugrid-bootstrap")["spec"]["template"]["spec"][
        "initContainers"]] == ["bus-bootstrap"]
    assert env_of(_deployments(objs)["renderer"]["spec"]["template"]["spec"]["containers"][0])[
        "TAU_CLUSTER"] == "default"
    conf = one(objs, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    assert "domain:" not in conf and "leafnodes" not in conf


def _fails(*sets: str) -> str:
    args = [str(tool("helm")), "template", "t", str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0, proc.stdout[:200]
    return proc.stderr


def test_what_a_hub_or_site_cannot_run_fails_the_render_with_the_fix() -> None:
    assert "services.dispatcher.enabled is false" in _fails(*HUB, "services.dispatcher.enabled=false")
    assert "don't meet the specifications of the schema" in _fails("site.enabled=true", "site.cluster=West",
                                                                    "site.hub.address=h:7422")
    assert "don't meet the specifications of the schema" in _fails("site.enabled=true", "site.cluster=west")
    assert "'dispatch' is reserved" in _fails("site.enabled=true", "site.cluster=dispatch", "site.hub.address=h:1",
                                              "platform.enabled=true", "platform.config.clusters[0].name=dispatch")
    assert "needs platform.enabled" in _fails(*SITE[:4])
    assert 'site.cluster "north" is not among platform.config.clusters [west east]' in _fails(
        *SITE, "site.cluster=north")
    assert "set nats.cluster.replicas to 1" in _fails(*SITE, "nats.cluster.replicas=3")
    assert "people use the hub's" in _fails(*SITE, "nats.embedded.external.enabled=true")


def test_a_site_renders_its_leaf_server_and_its_services_only(render: Render) -> None:
    objs = _template(*SITE, namespace="west")
    _validate(objs)
    assert {f'{o["kind"]}/{o["metadata"]["name"]}' for o in objs if o["kind"] in {
        "Deployment", "StatefulSet", "Job", "DaemonSet", "ConfigMap", "Service", "ServiceAccount"}} == {
        "StatefulSet/t-taugrid-nats", "ConfigMap/t-taugrid-nats", "Service/t-taugrid-nats",
        "ConfigMap/t-taugrid-platform", "Job/t-taugrid-site", "ServiceAccount/t-taugrid-bootstrap",
        "Service/t-taugrid-nats-headless", *(f"{k}/t-taugrid-{s}" for s in ["kube-bridge", "log-shipper",
                                                                          "health-monitor"]
                                             for k in ["Deployment", "ServiceAccount"])}
    conf = one(objs, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    deny = (f"    deny_exports: {json.dumps(list(bus_sites.SITE_DENY_EXPORTS))}\n"
            f"    deny_imports: {json.dumps(list(bus_sites.SITE_DENY_IMPORTS))}\n")
    assert ('leafnodes {\n  reconnect: "1s"\n  remotes: [{\n    url: $TAU_LEAF_URL\n' + deny +
            '    tls {\n      ca_file: "/etc/nats-hub-ca/ca.crt"\n    }\n  }]\n}\n') in conf
    assert "  domain: west\n" in conf and "server_name: $TAU_SERVER_NAME\n" in conf and "pid_file" not in conf
    sts = one(objs, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"]
    assert "shareProcessNamespace" not in sts and [c["name"] for c in sts["containers"]] == ["nats"]
    (init,) = sts["initContainers"]
    assert init["command"] == ["python", "-m", "taugrid.stack.chartauth", "render", "--identities",
                               "/etc/taugrid/identities/identities.json", "--out", "/run/nats/auth.conf",
                               "--site", "west"]
    assert env_of(sts["containers"][0]) == {
        "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}}, "GOMEMLIMIT": "900MiB",
        "TAU_SERVER_NAME": "west-$(POD_NAME)",
        "TAU_LEAF_PASSWORD": {"secretKeyRef": {"name": "taugrid-leaf-password", "key": "password"}},
        "TAU_LEAF_URL": "tls://leaf-west:$(TAU_LEAF_PASSWORD)@hub.example.org:7422"}
    job = one(objs, "Job", "t-taugrid-site")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["python", "-m", "taugrid.stack.chartsites", "site", "--cluster", "west",
                            "--service-keys", "/etc/taugrid/hub/identities.json",
                            "--platform", "/etc/taugrid/platform/platform.yaml"]
    assert {k: env_of(c)[k] for k in ["TAU_NATS_URL", "TAU_CLUSTER", "TAU_SITE"]} == {
        "TAU_NATS_URL": "nats://t-taugrid-nats.west.svc:4222", "TAU_CLUSTER": "west", "TAU_SITE": "on"}
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["bus-creds"]["secret"]["items"] == [{"key": "bootstrap.nk", "path": "creds"}]  # the site's own
    assert volumes["hub-identities"]["secret"] == {"secretName": "taugrid-hub-identities", "defaultMode": 292,
                                                   "items": [{"key": "identities.json", "path": "identities.json"}]}
    hub_ca = next(v for v in sts["volumes"] if v["name"] == "hub-ca")
    assert hub_ca["secret"] == {"secretName": "hub-ca", "defaultMode": 292, "items": [{"key": "ca.crt",
                                                                                        "path": "ca.crt"}]}
    for name, d in _deployments(objs).items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        env = env_of(c)
        assert {k: env[k] for k in ["TAU_NATS_URL", "TAU_BACKEND", "TAU_CLUSTER", "TAU_SITE", "TAU_NATS_CREDS",
                                    "TAU_NATS_CA"]} == {
            "TAU_NATS_URL": "nats://t-taugrid-nats.west.svc:4222", "TAU_BACKEND": "kubernetes",
            "TAU_CLUSTER": "west", "TAU_SITE": "on", "TAU_NATS_CREDS": "/etc/taugrid/bus/creds",
            "TAU_NATS_CA": "/etc/taugrid/nats-ca/ca.crt"}, name
    plain = _template(*SITE, "site.hub.tls.enabled=false", namespace="west")
    conf = one(plain, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    assert "ca_file" not in conf and env_of(one(plain, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"][
        "containers"][0])["TAU_LEAF_URL"] == "nats-leaf://leaf-west:$(TAU_LEAF_PASSWORD)@hub.example.org:7422"


def _users(auth_conf: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in auth_conf.splitlines() if line.strip().startswith("{")]


def _credentials(root: Path, name: str) -> tuple[dict[str, str], Path]:
    """`tau admin chart-credentials` into its own directory: the Secret's items, and identities.json as mounted."""
    result = CliRunner().invoke(cli, ["admin", "chart-credentials", "--dir", str(root / name / "operator"),
                                      "--admin", "ops", "--out", str(root / name / "secrets.yaml")])
    assert result.exit_code == 0, result.output
    (secret,) = [d for d in yaml.safe_load_all((root / name / "secrets.yaml").read_text()) if d]
    data: dict[str, str] = secret["stringData"]
    (root / name / "identities.json").write_text(data["identities.json"])
    for key in ["bootstrap.nk", "svc-kube_bridge.nk", "svc-dispatcher.nk"]:
        (root / name / key).write_text(data[key])
        (root / name / key).chmod(0o600)
    return data, root / name / "identities.json"


def _kubelet_env(container: Obj, given: dict[str, str]) -> dict[str, str]:
    """The container's env as the kubelet gives it: secret refs from ``given``, $(VAR) of earlier entries
    expanded."""
    out: dict[str, str] = {}
    for e in container["env"]:
        value = given[e["name"]] if "valueFrom" in e else e["value"]
        out[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: out[m.group(1)], value)
    return out


def _conf(objs: list[Obj], root: Path, mapping: dict[str, str]) -> Path:
    text = one(objs, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    for pod, here in mapping.items():
        assert pod in text, pod
        text = text.replace(pod, here)
    conf = root / "etc" / "nats" / "nats.conf"  # its include "../../run/nats/auth.conf" lands in root/run/nats
    conf.parent.mkdir(parents=True)
    conf.write_text(text)
    return conf


def _leafz(monitor: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/leafz", timeout=5) as resp:  # noqa: S310 - loopback
        return list(json.loads(resp.read()).get("leafs") or [])


async def test_the_rendered_hub_and_site_link_and_both_ways_cross_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    certs = tmp_path / "tls"
    make_certs(certs)  # a certificate for localhost, as the chart's is for its Service's name
    hub_data, hub_ids = _credentials(tmp_path, "hub")
    _site_data, site_ids = _credentials(tmp_path, "site")  # the site's own identities, never the hub's
    leaves = tmp_path / "hub" / "leaves.json"
    assert chartauth._main(["leaf", "--cluster", "west", "--identities", str(site_ids), "--out", str(leaves)]) == 0
    password = capsys.readouterr().out.strip()
    assert chartauth._main(["leaf", "--cluster", "west", "--identities", str(site_ids), "--out", str(leaves)]) == 0
    assert capsys.readouterr().out.strip() == password  # made once, kept
    site_key = json.loads(site_ids.read_text())["services"]["kube_bridge"]
    assert json.loads(leaves.read_text()) == {"west": {"password": password, "key": site_key}}

    hub_root, site_root = tmp_path / "hubpod", tmp_path / "sitepod"
    hub_auth, site_auth = hub_root / "run" / "nats" / "auth.conf", site_root / "run" / "nats" / "auth.conf"
    assert chartauth._main(["render", "--identities", str(hub_ids), "--out", str(hub_auth),
                            "--leaves", str(leaves)]) == 0  # the hub's auth-init
    assert chartauth._main(["render", "--identities", str(site_ids), "--out", str(site_auth),
                            "--site", "west"]) == 0  # the site's auth-init
    leaf_entry = next(u for u in _users(hub_auth.read_text()) if u.get("user") == "leaf-west")
    assert leaf_entry == {"user": "leaf-west", "password": password, "permissions": permissions.leaf_permissions(
        "west", permissions.inbox_prefix(site_key)).as_conf()}  # exactly the grant `tau up` gives a site
    site_ids_json = json.loads(site_ids.read_text())
    assert sorted(u["nkey"] for u in _users(site_auth.read_text())) == sorted(
        [site_ids_json["bootstrap"], *(site_ids_json["services"][s] for s in chartauth.SITE_SERVICES)])

    hub_port, hub_mon, leaf_port, site_port, site_mon = (free_port() for _ in range(5))
    hub_objs = _template(*HUB)
    hub_conf = _conf(hub_objs, hub_root, {
        "0.0.0.0:4222": f"127.0.0.1:{hub_port}", "0.0.0.0:8222": f"127.0.0.1:{hub_mon}",
        "0.0.0.0:7422": f"127.0.0.1:{leaf_port}", "store_dir: /data": f"store_dir: {hub_root / 'data'}",
        '"/run/nats/': f'"{hub_root}/run/nats/', '"/etc/nats-tls/': f'"{certs}/'})
    site_objs = _template(*SITE, f"site.hub.address=localhost:{leaf_port}", namespace="west")
    site_conf = _conf(site_objs, site_root, {
        "0.0.0.0:4222": f"127.0.0.1:{site_port}", "0.0.0.0:8222": f"127.0.0.1:{site_mon}",
        "store_dir: /data": f"store_dir: {site_root / 'data'}", '"/etc/nats-tls/': f'"{certs}/',
        '"/etc/nats-hub-ca/': f'"{certs}/'})
    site_env = _kubelet_env(one(site_objs, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"][
        "containers"][0], {"POD_NAME": "t-taugrid-nats-0", "TAU_LEAF_PASSWORD": password})
    logs = [open(tmp_path / f"{n}.log", "ab") for n in ("hub", "site")]  # noqa: SIM115 - closed below
    procs = [subprocess.Popen([natsserver.binary(), "-c", str(hub_conf)], stdout=logs[0], stderr=logs[0],
                              env={**os.environ, "POD_NAME": "t-taugrid-nats-0"}),
             subprocess.Popen([natsserver.binary(), "-c", str(site_conf)], stdout=logs[1], stderr=logs[1],
                              env={**os.environ, **site_env})]
    ca = certs / "ca.crt"
    try:
        natsserver.wait_port(hub_port)
        natsserver.wait_port(site_port)
        deadline = time.monotonic() + 20
        while not (linked := _leafz(hub_mon)):
            assert time.monotonic() < deadline, (tmp_path / "site.log").read_text()[-2000:]
            await asyncio.sleep(0.1)
        (leaf,) = linked
        assert leaf["account"] == "$G" and leaf["name"] == "west-t-taugrid-nats-0"
        hub_boot = await connect(f"nats://localhost:{hub_port}", name="bootstrap", ca=ca,
                                 creds=tmp_path / "hub" / "bootstrap.nk")
        site_boot = await connect(f"nats://localhost:{site_port}", name="bootstrap", ca=ca,
                                  creds=tmp_path / "site" / "bootstrap.nk")
        try:
            platform_text = one(hub_objs, "ConfigMap", "t-taugrid-platform")["data"]["platform.yaml"]
            await bootstrap(hub_boot)  # the hub's bootstrap Job: the bus, then its "sites" step
            assert await chartsites.provision_hub(hub_boot, platform_text) == ["west", "east"]
            # the site's Job, with the hub's identities.json and the same platform
            assert one(site_objs, "ConfigMap", "t-taugrid-platform")["data"]["platform.yaml"] == platform_text
            await chartsites.provision_site(site_boot, "west", platform_text, chartsites.hub_service_keys(hub_ids))
            assert (await get_text(site_boot) or ("", 0))[0] == platform_text
            dispatcher_key = (await (await site_boot.kv("service_keys")).get("dispatcher")).value
            assert dispatcher_key == json.loads(hub_ids.read_text())["services"]["dispatcher"].encode()
            # a report at the site, as its kube-bridge, reaches the hub's SITE_WEST under site.west.
            bridge = await connect(f"nats://localhost:{site_port}", name="kube-bridge", ca=ca,
                                   creds=tmp_path / "site" / "svc-kube_bridge.nk")
            await bridge.js.publish("k8s.west.job.team-a.r1.modified", b"report")
            await bridge.close()
            # a request on the hub, as its dispatcher, reaches the site's SITE_IN
            dispatcher = await connect(f"nats://localhost:{hub_port}", name="dispatcher", ca=ca,
                                       creds=tmp_path / "hub" / "svc-dispatcher.nk")
            await dispatcher.js.publish("backend.west.apply", b"request")
            await dispatcher.js.publish("backend.east.apply", b"not west's")
            await dispatcher.close()
            deadline = time.monotonic() + 30
            while True:
                out = (await hub_boot.js.stream_info(bus_sites.hub_stream("west"))).state.messages
                into = (await site_boot.js.stream_info(bus_sites.SITE_IN)).state.messages
                if (out, into) == (1, 1):
                    break
                assert time.monotonic() < deadline, (out, into, (tmp_path / "site.log").read_text()[-2000:])
                await asyncio.sleep(0.2)
            got = await hub_boot.js.get_msg(bus_sites.hub_stream("west"), 1)
            assert (got.subject, got.data) == ("site.west.k8s.west.job.team-a.r1.modified", b"report")
            got = await site_boot.js.get_msg(bus_sites.SITE_IN, 1)
            assert (got.subject, got.data) == ("backend.west.apply", b"request")  # east's never crosses
        finally:
            await hub_boot.close()
            await site_boot.close()
        assert hub_data["svc-dispatcher.nk"]  # the dispatcher's seed is in the hub's Secret (its own grant)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        for log in logs:
            log.close()


def test_chartsites_refuses_a_site_the_platform_does_not_name_before_connecting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    platform = tmp_path / "platform.yaml"
    platform.write_text("clusters:\n- {name: west, backend: kubernetes}\n")
    keys = tmp_path / "identities.json"
    keys.write_text('{"services": {"dispatcher": "UKEY"}}')
    unreachable = f"nats://127.0.0.1:{free_port()}"
    assert chartsites.main(["site", "--url", unreachable, "--platform", str(platform), "--cluster", "north",
                            "--service-keys", str(keys)]) == 2
    assert capsys.readouterr().err == ("site.cluster 'north' is not among the platform's clusters ['west']: name "
                                       "the cluster as platform.yaml's clusters do\n")
    keys.write_text("{}")
    assert chartsites.main(["site", "--url", unreachable, "--platform", str(platform), "--cluster", "west",
                            "--service-keys", str(keys)]) == 2
    assert "not the hub's identities.json" in capsys.readouterr().err


def test_the_hubs_auth_sync_keeps_its_sites_leaf_users_on_every_platform_revision(tmp_path: Path) -> None:
    _data, ids_path = _credentials(tmp_path, "hub")
    ids = chartauth.load_identities(ids_path)
    leaves = tmp_path / "leaves.json"
    leaves.write_text(json.dumps({"west": {"password": "p" * 20, "key": ids.services["kube_bridge"]}}))
    out = tmp_path / "auth.conf"
    syncer = chartauth.Syncer(ids, out=out, pid_file=tmp_path / "none.pid", leaves_file=leaves)
    syncer.apply("clusters:\n- {name: west, backend: kubernetes}\n", 1)
    (leaf,) = [u for u in _users(out.read_text()) if "user" in u]
    assert leaf == {"user": "leaf-west", "password": "p" * 20, "permissions": permissions.leaf_permissions(
        "west", permissions.inbox_prefix(ids.services["kube_bridge"])).as_conf()}
    # a cluster's entry added to the Secret (the kubelet updates the mounted file): its leaf user, no restart
    leaves.write_text(json.dumps({"west": {"password": "p" * 20, "key": ids.services["kube_bridge"]},
                                  "east": {"password": "q" * 20, "key": ids.services["kube_bridge"]}}))
    syncer.check_files()
    assert sorted(u["user"] for u in _users(out.read_text()) if "user" in u) == ["leaf-east", "leaf-west"]
    assert syncer.platform is not None and "ops" in out.read_text()  # the platform's users kept beside them
    good = out.read_text()
    leaves.write_text("{not json")
    syncer.check_files()
    assert out.read_text() == good  # a bad edit keeps the previous leaf users
    leaves.write_text(json.dumps({"west": {"password": "short", "key": "U"}}))
    with pytest.raises(PermanentError, match="west's password must be 16 or more"):
        chartauth.load_leaves(leaves)
    leaves.write_text(json.dumps({"West": {"password": "p" * 20, "key": "U"}}))
    with pytest.raises(PermanentError, match="'West' is not a cluster name"):
        chartauth.load_leaves(leaves)
