"""The Helm chart renders what operators and the services need, and nothing invalid.

Runs the real `helm` (extracted by tests/chart/tools.py) on charts/taugrid and validates every rendered object
against the Kubernetes 1.30 OpenAPI schemas (kubernetes-validate, strict: unknown fields fail).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .tools import REPO, tool

CHART = REPO / "charts" / "taugrid"
K8S_VERSION = "1.30.0"
SERVICES = ["submitter", "run-record", "policy", "renderer", "admission-watcher", "health-monitor", "recovery",
            "evidence", "kube-bridge", "log-shipper", "portal"]
WITH_API_ACCESS = {"renderer", "kube-bridge", "health-monitor", "log-shipper"}

Obj = dict[str, Any]
Render = Callable[..., list[Obj]]


@pytest.fixture(scope="module")
def helm() -> Path:
    return tool("helm")  # raises (test error, not skip) when the binary cannot be extracted


def _helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def render(helm: Path) -> Render:
    def _render(*sets: str) -> list[Obj]:
        args = ["template", "t", str(CHART), "--namespace", "taugrid", "--kube-version", K8S_VERSION]
        for s in sets:
            args += ["--set", s]
        proc = _helm(helm, *args)
        assert proc.returncode == 0, proc.stderr
        return [d for d in yaml.safe_load_all(proc.stdout) if d]

    return _render


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_specs(objs: list[Obj]) -> list[tuple[str, Obj]]:
    return [(f'{o["kind"]}/{o["metadata"]["name"]}', o["spec"]["template"]["spec"])
            for o in objs if o["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}]


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_helm_lint_passes_strict(helm: Path) -> None:
    proc = _helm(helm, "lint", str(CHART), "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_kubectl_is_extracted_alongside_helm() -> None:
    proc = subprocess.run([str(tool("kubectl")), "version", "--client"], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 0 and "Client Version: v1." in proc.stdout, proc.stderr


def test_each_service_gets_its_own_deployment_running_its_module(render: Render) -> None:
    objs = render()
    deployments = {d["metadata"]["name"]: d for d in find(objs, "Deployment")}
    assert set(deployments) == {f"t-taugrid-{s}" for s in [*SERVICES, "anchor"]}
    for svc in [*SERVICES, "anchor"]:
        d = deployments[f"t-taugrid-{svc}"]
        (container,) = d["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["python", "-m", f"taugrid_services.{svc.replace('-', '_')}"]
        assert container["image"] == "ghcr.io/taugrid/taugrid:0.1.0"
        assert d["spec"]["template"]["spec"]["serviceAccountName"] == f"t-taugrid-{svc}"
        assert d["spec"]["replicas"] == 1
        env = env_of(container)
        assert env["TAU_NATS_URL"] == "nats://t-taugrid-nats.taugrid.svc:4222"
        assert env["TAU_BACKEND"] == "kubernetes" and env["TAU_CLUSTER"] == "default"
        assert "livenessProbe" not in container  # see serviceDefaults.livenessProbe in values.yaml for why
    assert not find(objs, "PodDisruptionBudget"), "no PDB for single-replica services"


def test_the_anchor_appends_signed_heads_to_its_own_kept_volume_with_its_own_seed(render: Render) -> None:
    objs = render()
    d = one(objs, "Deployment", "t-taugrid-anchor")
    assert (d["spec"]["replicas"], d["spec"]["strategy"]) == (1, {"type": "Recreate"})  # one writer, always
    spec = d["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = env_of(container)
    assert (env["TAU_ANCHOR_FILE"], env["TAU_ANCHOR_KEY"], env["TAU_ANCHOR_INTERVAL_S"]) == (
        "/var/lib/taugrid/anchors/ledger.jsonl", "/etc/taugrid/anchor/anchor-signing.nk", "60")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["anchors"]["persistentVolumeClaim"] == {"claimName": "t-taugrid-anchors"}
    assert volumes["anchor-key"]["secret"]["items"] == [{"key": "anchor-signing.nk", "path": "anchor-signing.nk"}]
    assert volumes["bus-creds"]["secret"]["items"] == [{"key": "svc-anchor.nk", "path": "creds"}]
    pvc = one(objs, "PersistentVolumeClaim", "t-taugrid-anchors")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert not find(render("auth.enabled=false", "sourceFetch.credsSecret="), "Deployment", "t-taugrid-anchor")
    assert not find(render("anchor.enabled=false"), "PersistentVolumeClaim", "t-taugrid-anchors")


def test_the_portal_listens_on_all_interfaces_behind_a_service_and_is_ready_when_it_answers(render: Render) -> None:
    objs = render("services.portal.replicas=2", "services.portal.port=9000")
    (container,) = one(objs, "Deployment", "t-taugrid-portal")["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    assert (env["TAU_PORTAL_HOST"], env["TAU_PORTAL_PORT"]) == ("0.0.0.0", "9000")
    assert container["ports"] == [{"name": "http", "containerPort": 9000}]
    assert container["readinessProbe"] == {"httpGet": {"path": "/api/portal", "port": "http"}, "periodSeconds": 10}
    service = one(objs, "Service", "t-taugrid-portal")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 9000, "targetPort": "http"}]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "portal"
    assert one(objs, "PodDisruptionBudget", "t-taugrid-portal")["spec"]["maxUnavailable"] == 1
    assert not find(render("services.portal.enabled=false"), "Service", "t-taugrid-portal")


def test_metrics_stay_off_until_one_value_turns_them_on(render: Render) -> None:
    import json
    import re

    from prometheus_client import REGISTRY

    from taugrid.bus import metrics

    metrics.make_all()  # registers every taugrid metric (a process makes them on first use)

    off = render()
    assert not find(off, "Service", "t-taugrid-metrics") and not find(off, "ConfigMap", "t-taugrid-dashboard-queues")
    assert not find(off, "NetworkPolicy", "t-taugrid-metrics")
    for svc in SERVICES:
        (container,) = one(off, "Deployment", f"t-taugrid-{svc}")["spec"]["template"]["spec"]["containers"]
        assert "TAU_METRICS_PORT" not in env_of(container) and "TAU_METRICS_ADDR" not in env_of(container)
    on = render("metrics.enabled=true")
    for svc in SERVICES:
        template = one(on, "Deployment", f"t-taugrid-{svc}")["spec"]["template"]
        (container,) = template["spec"]["containers"]
        assert env_of(container)["TAU_METRICS_PORT"] == "9090"
        # its own IP, not every interface (taugrid.bus.metrics listens on 127.0.0.1 when no address is named)
        assert env_of(container)["TAU_METRICS_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert {"name": "metrics", "containerPort": 9090} in container["ports"]
        assert template["metadata"]["labels"]["taugrid.io/metrics"] == "true"
    service = one(on, "Service", "t-taugrid-metrics")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"app.kubernetes.io/instance": "t", "taugrid.io/metrics": "true"}
    known = {m.name for m in REGISTRY.collect()}
    names = set()
    for board in ("cluster", "queues", "runs", "gpu-health"):
        cm = one(on, "ConfigMap", f"t-taugrid-dashboard-{board}")
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        dashboard = json.loads(cm["data"][f"{board}.json"])
        assert dashboard["uid"] == f"taugrid-{board}" and dashboard["panels"]
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                names |= set(re.findall(r"taugrid_[a-z_]+", target["expr"]))
    suffixes = ("_bucket", "_count", "_total")
    unknown = {n for n in names if n not in known and not any(n.endswith(x) and n[: -len(x)] in known
                                                                for x in suffixes)}
    assert not unknown, f"dashboards use metrics the code does not define: {unknown}"
    assert not find(on, "ServiceMonitor")
    monitor = one(render("metrics.enabled=true", "metrics.serviceMonitor.enabled=true",
                         "metrics.serviceMonitor.labels.release=prom"), "ServiceMonitor", "t-taugrid")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "metrics"
    assert monitor["spec"]["endpoints"][0] | {"relabelings": None} == {
        "port": "metrics", "path": "/metrics", "interval": "30s", "relabelings": None}


def test_only_the_named_scrapers_reach_the_metrics_port(render: Render) -> None:
    def ingress(*sets: str) -> list[Obj]:
        policy = one(render("metrics.enabled=true", *sets), "NetworkPolicy", "t-taugrid-metrics")
        assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/instance": "t",
                                                                 "taugrid.io/metrics": "true"}}
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        ingress: list[Obj] = policy["spec"]["ingress"]
        return ingress

    portal = {"ports": [{"port": 8470}]}  # the portal's pods serve /metrics too; their own port stays open
    assert ingress() == [portal]
    assert ingress("services.portal.enabled=false") == []
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert ingress("metrics.scrapers[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
                   "metrics.port=9100") == [{"from": [scraper], "ports": [{"port": 9100}]}, portal]
    assert not find(render("metrics.enabled=true", "metrics.networkPolicy=false"), "NetworkPolicy",
                    "t-taugrid-metrics")


def test_replicas_override_scales_one_service_and_adds_its_pdb(render: Render) -> None:
    objs = render("services.renderer.replicas=3", "services.evidence.enabled=false")
    assert one(objs, "Deployment", "t-taugrid-renderer")["spec"]["replicas"] == 3
    assert one(objs, "Deployment", "t-taugrid-policy")["spec"]["replicas"] == 1
    assert not find(objs, "Deployment", "t-taugrid-evidence")
    (pdb,) = find(objs, "PodDisruptionBudget")
    assert pdb["metadata"]["name"] == "t-taugrid-renderer" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "renderer"


def test_embedded_nats_is_a_single_statefulset_with_jetstream_on_a_pvc(render: Render) -> None:
    objs = render()
    sts = one(objs, "StatefulSet", "t-taugrid-nats")
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"
    conf = one(objs, "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    assert "store_dir: /data" in conf and "max_payload: 8MB" in conf
    assert one(objs, "Service", "t-taugrid-nats")["spec"]["ports"][0]["port"] == 4222


def test_the_nats_server_gets_go_s_soft_memory_limit_unless_it_is_emptied(render: Render) -> None:
    def server(objs: list[Obj]) -> Obj:
        sts = one(objs, "StatefulSet", "t-taugrid-nats")
        [container] = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "nats"]
        return container

    nats = server(render())
    assert env_of(nats)["GOMEMLIMIT"] == "900MiB" and nats["resources"]["limits"]["memory"] == "1Gi"
    assert env_of(server(render("nats.embedded.goMemLimit=2GiB")))["GOMEMLIMIT"] == "2GiB"
    assert "GOMEMLIMIT" not in env_of(server(render("nats.embedded.goMemLimit=")))


def test_external_nats_renders_no_server_and_points_every_service_at_it(render: Render) -> None:
    objs = render("nats.embedded.enabled=false", "nats.url=nats://bus.nats-system.svc:4222")
    assert not find(objs, "StatefulSet") and not find(objs, "ConfigMap", "t-taugrid-nats")
    for where, spec in pod_specs(objs):
        for c in spec["containers"] + spec.get("initContainers", []):
            assert env_of(c)["TAU_NATS_URL"] == "nats://bus.nats-system.svc:4222", where


def test_nats_url_from_a_secret_stays_out_of_the_manifests(render: Render) -> None:
    objs = render("nats.embedded.enabled=false", "nats.urlSecret.name=bus-creds")
    env = env_of(one(objs, "Deployment", "t-taugrid-policy")["spec"]["template"]["spec"]["containers"][0])
    assert env["TAU_NATS_URL"] == {"secretKeyRef": {"name": "bus-creds", "key": "url"}}


def test_the_renderer_knows_where_the_source_fetch_comes_from(render: Render) -> None:
    renderer = one(render(), "Deployment", "t-taugrid-renderer")["spec"]["template"]["spec"]["containers"][0]
    env = env_of(renderer)
    assert (env["TAU_SOURCE_FETCH_IMAGE"], env["TAU_SOURCE_FETCH_NATS_URL"], env["TAU_SOURCE_FETCH_CREDS_SECRET"]) == (
        "ghcr.io/taugrid/taugrid:0.1.0", "nats://t-taugrid-nats.taugrid.svc:4222", "taugrid-source-fetch")
    objs = render("sourceFetch.natsUrl=nats://bus.example:4222", "sourceFetch.credsSecret=tau-fetch",
                  "image.tag=1.2.3")
    env = env_of(one(objs, "Deployment", "t-taugrid-renderer")["spec"]["template"]["spec"]["containers"][0])
    assert (env["TAU_SOURCE_FETCH_IMAGE"], env["TAU_SOURCE_FETCH_NATS_URL"], env["TAU_SOURCE_FETCH_CREDS_SECRET"]) == (
        "ghcr.io/taugrid/taugrid:1.2.3", "nats://bus.example:4222", "tau-fetch")
    for name in SERVICES:
        if name != "renderer":
            container = one(objs, "Deployment", f"t-taugrid-{name}")["spec"]["template"]["spec"]["containers"][0]
            assert "TAU_SOURCE_FETCH_IMAGE" not in env_of(container), name


def _bus_rules(objs: list[Obj]) -> list[Obj]:
    return [r for r in one(objs, "NetworkPolicy", "t-taugrid-nats")["spec"]["ingress"] if {"port": 4222} in r["ports"]]


def _run_pods_in(*namespaces: str) -> Obj:
    return {"from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(namespaces)}]},
            "podSelector": {"matchLabels": {"taugrid.io/managed-by": "taugrid"}}}],
            "ports": [{"port": 4222}]}


RELEASE_PODS = {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "t",
                                                             "app.kubernetes.io/part-of": "taugrid"}}}],
                "ports": [{"port": 4222}]}


def test_embedded_nats_admits_run_pods_only_from_the_namespaces_the_platform_names(render: Render) -> None:
    # the label taugrid.io/managed-by is anyone's to set on their own pod: it admits nobody from another namespace
    assert _bus_rules(render()) == [RELEASE_PODS, _run_pods_in("taugrid")]
    named = render("rbac.workspaceNamespaces={ws-a,ws-b}", "nats.embedded.runNamespaces={ws-c,ws-a}")
    assert _bus_rules(named) == [RELEASE_PODS, _run_pods_in("taugrid", "ws-a", "ws-b", "ws-c")]
    cluster_wide = render("rbac.clusterWide=true", "nats.embedded.runNamespaces={ws-a}")
    assert _bus_rules(cluster_wide) == [RELEASE_PODS, _run_pods_in("taugrid", "ws-a")]


VARIANTS = {
    "default": (),
    "external-nats": ("nats.embedded.enabled=false", "nats.url=nats://bus:4222"),
    "scaled": ("services.renderer.replicas=3", "services.policy.replicas=2", "rbac.workspaceNamespaces={ws-a,ws-b}"),
    "cluster-wide+platform": ("rbac.clusterWide=true", "platform.enabled=true",
                              "platform.config.workspaces[0].name=ml", "nodeAgent.kmsg.enabled=true",
                              "nodeAgent.runtimeClassName=nvidia", "otel.endpoint=http://otel:4318"),
    "kmsg-privileged": ("nodeAgent.kmsg.enabled=true", "nodeAgent.kmsg.privileged=true"),
    "auth-off": ("auth.enabled=false", "sourceFetch.credsSecret="),
    "metrics": ("metrics.enabled=true",),
    "metrics+scrapers+namespaces": ("metrics.enabled=true", "metrics.scrapers[0].ipBlock.cidr=10.30.0.0/16",
                                    "rbac.workspaceNamespaces={ws-a}", "nats.embedded.runNamespaces={ws-b}"),
    "tls-off": ("nats.embedded.tls.enabled=false",),
    "tls+external+scrapers": (
        "nats.embedded.tls.enabled=true", "nats.embedded.tls.secretName=bus-tls", "nats.embedded.external.enabled=true",
        "nats.embedded.external.allowedFrom[0].ipBlock.cidr=10.20.0.0/16",
        "nats.embedded.monitoring.scrapers[0].namespaceSelector.matchLabels.name=monitoring",
        "platform.enabled=true", "platform.config.workspaces[0].name=ml"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_object_is_valid_kubernetes(render: Render, variant: str) -> None:
    objs = render(*VARIANTS[variant])
    assert len(objs) > 20
    for o in objs:
        try:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f'{o["kind"]}/{o["metadata"]["name"]}: {exc.message} at {list(exc.path)}')


def test_pods_meet_the_restricted_profile(render: Render) -> None:
    for where, spec in pod_specs(render()):
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where


@pytest.mark.parametrize("bad", [
    "services.renderer.replicas=three",  # --set keeps non-numbers as strings
    "services.rendrer.replicas=2",
    "nats.embedded.enabled=false",  # and no url
    "nats.url=http://bus:4222",
    "backend.cluster=prod.eu",  # would split the k8s.<cluster>.* subject
    "image.pullPolicy=Sometimes",
    "logLevel=LOUD",
    "rbac.workspaceNamespaces={Team_A}",
    "platform.enabled=true",  # with an empty platform.yaml
    "services.renderer.resources.requests.cpu=lots",
    "sourceFetch.credsSecret=",  # auth on: run pods would fetch their source without credentials
    "nats.embedded.external.type=Public",
    "nats.embedded.monitoring.scrapers[0].everyone=true",
    "nats.embedded.tls.certManager.enabled=true",  # and no issuer
    "nats.embedded.tls.generatedDays=0",
    "nats.embedded.runNamespaces={Team_A}",
    "metrics.scrapers[0].everyone=true",
    "services.health-monitor.rebootVia=ipmi",
])
def test_bad_values_fail_the_schema(helm: Path, bad: str) -> None:
    proc = _helm(helm, "template", "t", str(CHART), "--kube-version", K8S_VERSION, "--set", bad)
    assert proc.returncode != 0, f"{bad} rendered"
    assert "don't meet the specifications of the schema" in proc.stderr, proc.stderr


def test_bad_values_also_fail_lint(helm: Path) -> None:
    proc = _helm(helm, "lint", str(CHART), "--set-string", "services.renderer.replicas=three")
    assert proc.returncode != 0 and "want integer" in proc.stdout + proc.stderr


def rules_of(objs: list[Obj], role: str) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in one(objs, "ClusterRole", role)["rules"]
            for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def bindings_for(objs: list[Obj], sa: str) -> list[Obj]:
    return [b for b in find(objs, "RoleBinding") + find(objs, "ClusterRoleBinding")
            if any(s["name"] == sa for s in b["subjects"])]


def test_renderer_rbac_has_exactly_the_verbs_it_needs(render: Render) -> None:
    objs = render("rbac.workspaceNamespaces={ws-a,ws-b}")
    write = {"create", "patch", "delete"}
    assert rules_of(objs, "t-taugrid-renderer") == {
        (g, r, v) for g, r in [("batch", "jobs"), ("", "services"), ("ray.io", "rayjobs")] for v in write}
    bindings = bindings_for(objs, "t-taugrid-renderer")
    assert sorted((b["kind"], b["metadata"]["namespace"]) for b in bindings) == [
        ("RoleBinding", "ws-a"), ("RoleBinding", "ws-b")]
    assert all(b["roleRef"]["name"] == "t-taugrid-renderer" for b in bindings)


def test_cluster_wide_rbac_binds_with_cluster_role_bindings(render: Render) -> None:
    objs = render("rbac.clusterWide=true", "rbac.workspaceNamespaces={ws-a}")
    assert not find(objs, "RoleBinding")
    assert [b["kind"] for b in bindings_for(objs, "t-taugrid-renderer")] == ["ClusterRoleBinding"]


def test_kube_bridge_and_health_monitor_get_only_their_grants(render: Render) -> None:
    objs = render("rbac.workspaceNamespaces={ws-a}")
    watch = {"list", "watch"}
    assert rules_of(objs, "t-taugrid-kube-bridge") == {
        (g, r, v) for g, r in [("batch", "jobs"), ("", "pods"), ("", "events"), ("ray.io", "rayjobs"),
                               ("kueue.x-k8s.io", "workloads")] for v in watch} | {
        ("kueue.x-k8s.io", "localqueues", v) for v in ("get", "list", "watch")} | {
        ("batch", "jobs", v) for v in ("get", "patch")} | {  # an elastic Job's growth is recorded on it, and
        # an elastic RayJob is resized through its RayCluster's worker group (kube/resize.py)
        ("ray.io", r, v) for r in ("rayjobs", "rayclusters") for v in ("get", "patch")}
    # `tau queue`: ClusterQueue status and the pending-workloads visibility API are cluster-scoped
    assert rules_of(objs, "t-taugrid-kube-bridge-nodes") == {("", "nodes", v) for v in watch} | {
        ("kueue.x-k8s.io", "clusterqueues", v) for v in ("get", "list", "watch")} | {
        ("visibility.kueue.x-k8s.io", "clusterqueues/pendingworkloads", "get")}
    assert rules_of(objs, "t-taugrid-kube-bridge-leases") == {("coordination.k8s.io", "leases", v) for v in watch}
    leases = one(objs, "RoleBinding", "t-taugrid-kube-bridge-leases")
    assert leases["metadata"]["namespace"] == "kube-node-lease"
    # cordon (read-modify-write of the node), Node conditions, and listing the node's pods to drain them
    assert rules_of(objs, "t-taugrid-health-monitor-nodes") == {("", "nodes", "get"), ("", "nodes", "patch"),
                                                                 ("", "nodes/status", "patch"), ("", "pods", "list")}
    assert rules_of(objs, "t-taugrid-health-monitor") == {("", "pods/eviction", "create")}
    bridge = one(objs, "Deployment", "t-taugrid-kube-bridge")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(bridge)["TAU_WATCH_NAMESPACES"] == "ws-a"


def test_reboots_through_medik8s_grant_node_maintenances_only_when_chosen(render: Render) -> None:
    def health_env(objs: list[dict[str, Any]]) -> dict[str, str]:
        return env_of(one(objs, "Deployment", "t-taugrid-health-monitor")["spec"]["template"]["spec"]["containers"][0])

    default = render("rbac.workspaceNamespaces={ws-a}")
    assert not find(default, "ClusterRole", "t-taugrid-health-monitor-maintenance")
    assert (health_env(default)["TAU_HEALTH_REBOOT_VIA"], health_env(default)["TAU_HEALTH_DRAIN_GRACE_S"]) == (
        "annotation", "30")
    medik8s = render("rbac.workspaceNamespaces={ws-a}", "services.health-monitor.rebootVia=nodemaintenance",
                     "services.health-monitor.drainGraceSeconds=90")
    assert rules_of(medik8s, "t-taugrid-health-monitor-maintenance") == {
        ("nodemaintenance.medik8s.io", "nodemaintenances", v) for v in ("get", "create", "patch", "delete")}
    assert [(b["kind"], b["subjects"][0]["name"]) for b in bindings_for(medik8s, "t-taugrid-health-monitor")
            if b["roleRef"]["name"] == "t-taugrid-health-monitor-maintenance"] == [
        ("ClusterRoleBinding", "t-taugrid-health-monitor")]
    assert (health_env(medik8s)["TAU_HEALTH_REBOOT_VIA"], health_env(medik8s)["TAU_HEALTH_DRAIN_GRACE_S"]) == (
        "nodemaintenance", "90")


def test_log_shipper_may_only_list_pods_and_read_their_logs(render: Render) -> None:
    objs = render("rbac.workspaceNamespaces={ws-a,ws-b}")
    assert rules_of(objs, "t-taugrid-log-shipper") == {("", "pods", "list"), ("", "pods", "watch"),
                                                       ("", "pods/log", "get")}
    assert {b["metadata"]["namespace"] for b in bindings_for(objs, "t-taugrid-log-shipper")} == {"ws-a", "ws-b"}
    shipper = one(objs, "Deployment", "t-taugrid-log-shipper")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(shipper)["TAU_WATCH_NAMESPACES"] == "ws-a,ws-b"


def test_other_services_get_no_api_access(render: Render) -> None:
    objs = render("rbac.workspaceNamespaces={ws-a}")
    for svc in SERVICES:
        spec = one(objs, "Deployment", f"t-taugrid-{svc}")["spec"]["template"]["spec"]
        has_bindings = bool(bindings_for(objs, f"t-taugrid-{svc}"))
        assert spec["automountServiceAccountToken"] is (svc in WITH_API_ACCESS), svc
        assert has_bindings is (svc in WITH_API_ACCESS), svc
    assert not bindings_for(objs, "t-taugrid-node-agent") and not bindings_for(objs, "t-taugrid-bootstrap")
    assert not bindings_for(objs, "t-taugrid-anchor")
    anchor_pod = one(objs, "Deployment", "t-taugrid-anchor")["spec"]["template"]["spec"]
    assert anchor_pod["automountServiceAccountToken"] is False
    assert {sa["metadata"]["name"] for sa in find(objs, "ServiceAccount")} == {
        f"t-taugrid-{c}" for c in [*SERVICES, "node-agent", "anchor", "bootstrap"]}


def test_bootstrap_is_a_post_install_hook_running_the_bus_bootstrap(render: Render) -> None:
    job = one(render(), "Job", "t-taugrid-bootstrap")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    spec = job["spec"]["template"]["spec"]
    assert [c["command"] for c in spec["containers"]] == [
        ["python", "-m", "taugrid.bus.bootstrap", "--replicas", "1",
         "--service-keys", "/etc/taugrid/identities/identities.json"]]
    # the services' public keys the bootstrap publishes for the stages' signature checks (bus/authors.py)
    assert {"name": "bus-identities", "mountPath": "/etc/taugrid/identities", "readOnly": True} in \
        spec["containers"][0]["volumeMounts"]
    (ids,) = [v for v in spec["volumes"] if v["name"] == "bus-identities"]
    assert ids["secret"]["items"] == [{"key": "identities.json", "path": "identities.json"}]
    assert spec["automountServiceAccountToken"] is False


def test_platform_is_rendered_and_applied_after_the_bus_bootstrap(render: Render) -> None:
    objs = render("platform.enabled=true", "platform.config.workspaces[0].name=ml",
                  "platform.config.workspaces[0].namespace=team-ml")
    cm = one(objs, "ConfigMap", "t-taugrid-platform")
    assert yaml.safe_load(cm["data"]["platform.yaml"]) == {"workspaces": [{"name": "ml", "namespace": "team-ml"}]}
    spec = one(objs, "Job", "t-taugrid-bootstrap")["spec"]["template"]["spec"]
    assert [c["command"] for c in spec["initContainers"]] == [
        ["python", "-m", "taugrid.bus.bootstrap", "--replicas", "1",
         "--service-keys", "/etc/taugrid/identities/identities.json",
         "--platform", "/etc/taugrid/platform/platform.yaml"]]  # the streams' retention: the platform's
    assert {"name": "platform", "mountPath": "/etc/taugrid/platform", "readOnly": True} in \
        spec["initContainers"][0]["volumeMounts"]
    (apply,) = spec["containers"]
    assert apply["command"] == ["tau", "platform", "apply", "/etc/taugrid/platform.yaml", "--backend", "kubernetes"]
    assert {"name": "platform", "mountPath": "/etc/taugrid", "readOnly": True} in apply["volumeMounts"]
    assert bindings_for(objs, "t-taugrid-bootstrap")[0]["kind"] == "ClusterRoleBinding"
    assert ("kueue.x-k8s.io", "clusterqueues", "patch") in rules_of(objs, "t-taugrid-bootstrap-platform")


def test_node_agent_runs_on_gpu_nodes_with_its_node_name(render: Render) -> None:
    ds = one(render(), "DaemonSet", "t-taugrid-node-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    (c,) = spec["containers"]
    assert c["command"] == ["python", "-m", "taugrid_services.node_agent"]
    assert env_of(c)["TAU_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "runtimeClassName" not in spec and all(v["name"] != "kmsg" for v in spec["volumes"])


def test_node_agent_kmsg_is_mounted_read_only_when_enabled(render: Render) -> None:
    objs = render("nodeAgent.kmsg.enabled=true", "nodeAgent.runtimeClassName=nvidia")
    spec = one(objs, "DaemonSet", "t-taugrid-node-agent")["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    (c,) = spec["containers"]
    assert {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True} in c["volumeMounts"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_a_missing_tool_package_is_an_error_not_a_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    from . import tools

    monkeypatch.setattr(tools, "PACKAGE", "no-such-package-taugrid")
    with pytest.raises(tools.ToolError, match="is not installed"):
        tools.tool("helm")


def test_evidence_mounts_the_outputs_volume_read_only_and_keeps_small_outputs(render: Render) -> None:
    plain = one(render(), "Deployment", "t-taugrid-evidence")["spec"]["template"]["spec"]
    assert [v["name"] for v in plain["volumes"]] == ["tmp", "bus-creds", "nats-ca"]
    env = {e["name"]: e.get("value") for e in plain["containers"][0]["env"]}
    assert env["TAU_EVIDENCE_KEEP_OUTPUTS"] == "64Mi"
    objs = render("services.evidence.outputs.claimName=results", "services.evidence.keepOutputs=0")
    spec = one(objs, "Deployment", "t-taugrid-evidence")["spec"]["template"]["spec"]
    assert {"name": "outputs", "persistentVolumeClaim": {"claimName": "results", "readOnly": True}} in spec["volumes"]
    mounts = spec["containers"][0]["volumeMounts"]
    assert {"name": "outputs", "mountPath": "/data", "readOnly": True} in mounts
    assert {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}["TAU_EVIDENCE_KEEP_OUTPUTS"] == "0"
    policy = one(objs, "Deployment", "t-taugrid-policy")["spec"]["template"]["spec"]
    assert [v["name"] for v in policy["volumes"]] == ["tmp", "bus-creds", "nats-ca"]
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_s3_archive_credentials_reach_the_evidence_service_and_the_portal_only(render: Render) -> None:
    assert "envFrom" not in one(render(), "Deployment", "t-taugrid-evidence")["spec"]["template"]["spec"][
        "containers"][0]
    objs = render("services.evidence.archiveSecret=archive-writer", "services.portal.archiveSecret=archive-reader")
    for svc, secret in (("evidence", "archive-writer"), ("portal", "archive-reader")):
        container = one(objs, "Deployment", f"t-taugrid-{svc}")["spec"]["template"]["spec"]["containers"][0]
        assert container["envFrom"] == [{"secretRef": {"name": secret}}]
    assert "envFrom" not in one(objs, "Deployment", "t-taugrid-policy")["spec"]["template"]["spec"]["containers"][0]
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
