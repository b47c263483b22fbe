"""The sites of a many-cluster stack (``stack/sites.py``), in process: what `tau up` refuses to run, what each
service is told, and the leaf users the hub admits (their passwords kept across starts, closed to others)."""

from __future__ import annotations

import stat
from pathlib import Path

from taugrid.access.permissions import inbox_prefix
from taugrid.config.platform import load_platform
from taugrid.stack import auth, sites
from taugrid.stack.scaling import SERVICES
from tests.platforms import lab_platform

LOCAL = [{"name": "east", "backend": "local"}, {"name": "west", "backend": "local", "preference": 1}]


def test_local_clusters_are_run_and_what_tau_up_cannot_run_is_refused_with_the_fix() -> None:
    platform = load_platform(lab_platform(clusters=LOCAL))
    assert sites.refusal(platform, ha=False) is None
    assert sites.names(platform) == ["east", "west"]
    assert sites.refusal(load_platform(lab_platform()), ha=True) is None  # no clusters: nothing to refuse
    assert sites.names(load_platform(lab_platform())) == []
    kube = load_platform(lab_platform(clusters=[*LOCAL, {"name": "cloud", "backend": "kubernetes"}]))
    assert sites.refusal(kube, ha=False) == (
        "platform.yaml names Kubernetes clusters (cloud): `tau up` runs local clusters only (a Kubernetes cluster's "
        "site runs its kube-bridge against its own leaf node, not started here); declare them with backend: local, "
        "or remove them")
    assert sites.refusal(platform, ha=True) == (
        "platform.yaml names clusters, which `tau up --ha` does not run (the hub would be a JetStream cluster): start "
        "without --ha, or remove clusters")


def test_the_renderer_sends_to_the_dispatcher_and_each_site_runs_its_own_simulated_local_cluster(
        tmp_path: Path) -> None:
    ids = auth.ensure_identities(tmp_path / "creds", SERVICES)
    running = sites.Sites(tmp_path, ids, ["east", "west"])
    running.servers["west"].port = 4999
    assert sites.service_env(running, "renderer", "") == {"TAU_CLUSTER": "dispatch"}
    assert sites.service_env(running, "local_cluster", "west") == {
        "TAU_NATS_URL": "nats://127.0.0.1:4999", "TAU_SITE": "on", "TAU_CLUSTER": "west", "TAU_LOCAL_SIMULATE": "on",
        "TAU_DATA_DIR": str(tmp_path / "sites" / "west" / "data"), "TAU_NODE_NAME": "west-node",
        "TAU_NATS_CREDS": str(tmp_path / "creds" / "svc-local_cluster-west.nk")}
    assert (tmp_path / "sites" / "west" / "data").is_dir()
    assert sites.service_env(running, "policy", "") == {}


def test_each_site_has_a_leaf_user_whose_password_is_kept_and_closed(tmp_path: Path) -> None:
    ids = auth.ensure_identities(tmp_path / "creds", SERVICES)
    first = sites.Sites(tmp_path, ids, ["east", "west"]).leaf_users()
    again = sites.Sites(tmp_path, ids, ["east", "west"]).leaf_users()
    assert first == again
    assert [u.user for u in first] == ["leaf-east", "leaf-west"]
    assert first[0].password != first[1].password and len(first[0].password) >= 40
    # each site's local cluster has a key of its own, so its replies reach no other site's leaf node
    keys = [sites.Sites(tmp_path, ids, ["east", "west"]).local_cluster(n).public_key for n in ("east", "west")]
    assert [u.inbox for u in first] == [inbox_prefix(k) for k in keys]
    assert len(set(keys) | {ids.services["local_cluster"].public_key}) == 3
    assert stat.S_IMODE((tmp_path / "creds" / "svc-local_cluster-east.nk").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "creds" / "leaf-east.pw").stat().st_mode) == 0o600
    conf = auth.render(ids, None, first)
    assert conf.count('"user": "leaf-') == 2 and f'"password": "{first[0].password}"' in conf
