"""The chart deploys bus authentication: each pod mounts only its own identity's seed, the NATS pod renders and
follows the users, every connection is TLS by default (with a certificate the chart generates when none is named),
people reach the bus through a TLS Service, and the monitoring port is not open to all.

Renders with the real `helm` (tests/chart/tools.py); test_chart_bus.py runs the rendered server config."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest

from .test_chart import CHART, K8S_VERSION, SERVICES, Obj, Render, env_of, find, helm, one, pod_specs, render

__all__ = ["helm", "render"]  # the module-scoped fixtures of test_chart.py, shared
from .tools import tool

TLS_EXTERNAL = ("nats.embedded.tls.enabled=true", "nats.embedded.external.enabled=true",
                "nats.embedded.tls.certManager.enabled=true", "nats.embedded.tls.certManager.issuerRef.name=bus-ca",
                "nats.embedded.tls.dnsNames={bus.example.org}")


@pytest.fixture(scope="module")
def default(render: Render) -> list[Obj]:
    return render()


@pytest.fixture(scope="module")
def exposed(render: Render) -> list[Obj]:
    return render(*TLS_EXTERNAL, "nats.embedded.external.allowedFrom[0].ipBlock.cidr=10.20.0.0/16",
                  "nats.embedded.monitoring.scrapers[0].namespaceSelector.matchLabels.name=monitoring")


def creds_items(spec: Obj) -> list[str]:
    """The Secret keys a pod mounts from the bus credentials Secret."""
    return [item["key"] for v in spec.get("volumes", [])
            if v.get("secret", {}).get("secretName") == "taugrid-bus-credentials" for item in v["secret"]["items"]]


def test_every_taugrid_pod_mounts_only_its_own_identity(default: list[Obj]) -> None:
    expected = {f"Deployment/t-taugrid-{s}": [f"svc-{s.replace('-', '_')}.nk"] for s in SERVICES}
    expected |= {"DaemonSet/t-taugrid-node-agent": ["svc-node_agent.nk"],
                 "Job/t-taugrid-bootstrap": ["bootstrap.nk", "identities.json"],  # the services' public keys
                 "StatefulSet/t-taugrid-nats": ["identities.json", "svc-auth_sync.nk"],
                 # its signing seed (not a bus identity) beside its bus identity
                 "Deployment/t-taugrid-anchor": ["anchor-signing.nk", "svc-anchor.nk"]}
    assert {where: creds_items(spec) for where, spec in pod_specs(default)} == expected
    for where, spec in pod_specs(default):
        if where == "StatefulSet/t-taugrid-nats":
            continue
        for c in spec["containers"] + spec.get("initContainers", []):
            env = env_of(c)
            assert env["TAU_NATS_CREDS"] == "/etc/taugrid/bus/creds", where
            assert env["TAU_LOCAL_ADMIN"] == {"secretKeyRef": {"name": "taugrid-bus-credentials", "key": "local-admin"}}
            assert {"name": "bus-creds", "mountPath": "/etc/taugrid/bus", "readOnly": True} in c["volumeMounts"], where


def test_the_nats_pod_renders_its_users_and_a_sidecar_follows_the_platform(default: list[Obj],
                                                                            render: Render) -> None:
    spec = one(default, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"]
    assert spec["shareProcessNamespace"] is True  # the sidecar signals nats-server to reload
    (init,) = spec["initContainers"]
    assert init["command"][:4] == ["python", "-m", "taugrid.stack.chartauth", "render"]
    nats, sync = spec["containers"]
    assert nats["name"] == "nats" and sync["name"] == "auth-sync"
    # TLS is on by default: the sidecar reaches its own server by the name the certificate holds
    assert sync["command"] == ["python", "-m", "taugrid.stack.chartauth", "sync", "--identities",
                               "/etc/taugrid/identities/identities.json", "--out", "/run/nats/auth.conf",
                               "--pid-file", "/run/nats/nats.pid", "--url", "nats://t-taugrid-nats.taugrid.svc:4222",
                               "--watch", "/etc/nats-tls/tls.crt", "--watch", "/etc/nats-tls/tls.key"]
    assert env_of(sync)["TAU_NATS_CREDS"] == "/etc/taugrid/bus/creds"
    conf = one(default, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    assert 'pid_file: "/run/nats/nats.pid"' in conf and 'include "../../run/nats/auth.conf"' in conf
    assert not find(default, "Service", "t-taugrid-nats-external") and not find(default, "Certificate")
    plain = one(render("nats.embedded.tls.enabled=false"), "StatefulSet", "t-taugrid-nats")["spec"]["template"]
    assert plain["spec"]["containers"][1]["command"][-2:] == ["--url", "nats://127.0.0.1:4222"]


def test_auth_off_renders_no_credentials_anywhere(render: Render) -> None:
    objs = render("auth.enabled=false", "sourceFetch.credsSecret=")
    for where, spec in pod_specs(objs):
        assert creds_items(spec) == [], where
        for c in spec["containers"] + spec.get("initContainers", []):
            assert "TAU_NATS_CREDS" not in env_of(c), where
    spec = one(objs, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["nats"] and "initContainers" not in spec
    assert "include" not in one(objs, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]


def test_people_reach_the_bus_through_a_tls_service(exposed: list[Obj]) -> None:
    svc = one(exposed, "Service", "t-taugrid-nats-external")
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"] == [{"name": "client-tls", "port": 4222, "targetPort": "client"}]
    conf = one(exposed, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    assert 'cert_file: "/etc/nats-tls/tls.crt"' in conf and "allow_non_tls" not in conf  # TLS for everyone
    cert = one(exposed, "Certificate", "t-taugrid-nats")
    assert cert["apiVersion"] == "cert-manager.io/v1"
    assert cert["spec"]["secretName"] == "t-taugrid-nats-tls"
    assert cert["spec"]["dnsNames"] == ["bus.example.org", "t-taugrid-nats.taugrid.svc"]
    assert cert["spec"]["issuerRef"] == {"name": "bus-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    spec = one(exposed, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "t-taugrid-nats-tls", "defaultMode": 0o440}} in spec["volumes"]
    sync = spec["containers"][1]
    assert sync["command"][-6:] == ["--url", "nats://t-taugrid-nats.taugrid.svc:4222",  # the certificate's name
                                    "--watch", "/etc/nats-tls/tls.crt", "--watch", "/etc/nats-tls/tls.key"]


def _openssl(*args: str, cwd: Path) -> str:
    openssl = shutil.which("openssl")
    assert openssl, "the TLS test needs the openssl command line tool"
    return subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=30).stdout


def test_tls_is_on_by_default_with_a_certificate_the_chart_generates(default: list[Obj], tmp_path: Path) -> None:
    conf = one(default, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    assert 'cert_file: "/etc/nats-tls/tls.crt"' in conf and 'key_file: "/etc/nats-tls/tls.key"' in conf
    assert "allow_non_tls" not in conf  # every connection, services' and run pods' included
    secret = one(default, "Secret", "t-taugrid-nats-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep",
                                                 "taugrid.io/dns-names": "t-taugrid-nats.taugrid.svc"}
    assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    for key, value in secret["data"].items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    assert _openssl("verify", "-CAfile", "ca.crt", "tls.crt", cwd=tmp_path).strip() == "tls.crt: OK"
    names = _openssl("x509", "-in", "tls.crt", "-noout", "-ext", "subjectAltName", cwd=tmp_path)
    assert names.split("\n")[1].strip() == "DNS:t-taugrid-nats.taugrid.svc"  # the name every pod connects to
    assert "CA:TRUE" in _openssl("x509", "-in", "ca.crt", "-noout", "-ext", "basicConstraints", cwd=tmp_path)
    spec = one(default, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "t-taugrid-nats-tls", "defaultMode": 0o440}} in spec["volumes"]
    assert not find(default, "Certificate")


def test_the_chart_generates_no_certificate_it_is_given_or_told_to_skip(render: Render, exposed: list[Obj]) -> None:
    named = render("nats.embedded.tls.secretName=bus-tls")
    assert not find(named, "Secret")  # the bus credentials come from `tau admin chart-credentials`, not the chart
    spec = one(named, "StatefulSet", "t-taugrid-nats")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "bus-tls", "defaultMode": 0o440}} in spec["volumes"]
    assert not find(exposed, "Secret") and one(exposed, "Certificate", "t-taugrid-nats")  # cert-manager writes it
    plain = render("nats.embedded.tls.enabled=false")
    assert not find(plain, "Secret") and "tls {" not in one(plain, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    for where, spec in pod_specs(plain):
        assert all(v["name"] not in {"tls", "nats-ca"} for v in spec["volumes"]), where
        for c in spec["containers"]:
            assert "TAU_NATS_CA" not in env_of(c), where


def test_a_generated_certificate_names_the_dns_names_too(render: Render, tmp_path: Path) -> None:
    secret = one(render("nats.embedded.tls.dnsNames={bus.example.org}"), "Secret", "t-taugrid-nats-tls")
    assert secret["metadata"]["annotations"]["taugrid.io/dns-names"] == "bus.example.org,t-taugrid-nats.taugrid.svc"
    (tmp_path / "tls.crt").write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    names = _openssl("x509", "-in", "tls.crt", "-noout", "-ext", "subjectAltName", cwd=tmp_path)
    assert names.split("\n")[1].strip() == "DNS:bus.example.org, DNS:t-taugrid-nats.taugrid.svc"


@pytest.mark.parametrize("variant", ["default", "exposed"])
def test_every_taugrid_pod_verifies_the_server_against_the_ca(variant: str, default: list[Obj],
                                                               exposed: list[Obj]) -> None:
    objs = default if variant == "default" else exposed
    ca_volume = {"name": "nats-ca", "secret": {"secretName": "t-taugrid-nats-tls", "defaultMode": 0o444,
                                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
    for where, spec in pod_specs(objs):
        assert ca_volume in spec["volumes"], where
        for c in spec["containers"]:
            if c["name"] == "nats":
                continue
            assert env_of(c)["TAU_NATS_CA"] == "/etc/taugrid/nats-ca/ca.crt", where
            assert {"name": "nats-ca", "mountPath": "/etc/taugrid/nats-ca", "readOnly": True} in c["volumeMounts"]
    renderer = one(objs, "Deployment", "t-taugrid-renderer")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(renderer)["TAU_SOURCE_FETCH_NATS_CA"] == "/etc/taugrid/nats-ca/ca.crt"  # for run pods


def _ingress(objs: list[Obj]) -> list[Obj]:
    return one(objs, "NetworkPolicy", "t-taugrid-nats")["spec"]["ingress"]


def _open_to(rules: list[Obj], port: int) -> list[Obj]:
    return [r for r in rules if {"port": port} in r.get("ports", [])]


def test_the_monitoring_port_is_closed_unless_a_scraper_is_named(default: list[Obj], exposed: list[Obj]) -> None:
    assert _open_to(_ingress(default), 8222) == []
    assert _open_to(_ingress(exposed), 8222) == [
        {"from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}], "ports": [{"port": 8222}]}]
    for rule in _ingress(default) + _ingress(exposed):  # no rule without `from` opens the monitoring port
        assert "from" in rule or {"port": 8222} not in rule["ports"], rule


def test_people_are_admitted_to_the_client_port_only_with_the_external_service(default: list[Obj],
                                                                                 exposed: list[Obj]) -> None:
    assert all("from" in r for r in _ingress(default))  # only release pods and run pods
    assert {"from": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 4222}]} in _ingress(exposed)


@pytest.mark.parametrize(("sets", "message"), [
    (("nats.embedded.external.enabled=true", "nats.embedded.tls.enabled=false"), "needs nats.embedded.tls.enabled"),
    (("nats.embedded.external.enabled=true", "nats.embedded.tls.enabled=true", "auth.enabled=false"),
     "needs auth.enabled"),
])
def test_an_exposed_bus_without_tls_or_auth_is_refused(sets: tuple[str, ...], message: str) -> None:
    args = [str(tool("helm")), "template", "t", str(CHART), "--kube-version", K8S_VERSION]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_values_document_the_operator_command() -> None:
    values = (Path(CHART) / "values.yaml").read_text()
    assert "tau admin chart-credentials --namespace <release ns> -n <workspace ns>" in values
