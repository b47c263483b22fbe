"""Pod manifest → host run, pure: $(VAR) expansion and mount-path rewriting."""

from __future__ import annotations

from pathlib import Path

import pytest

from taugrid.local.podspec import PodSpecError, expand, kubernetes_only, plan, rewrite_paths

VARS = {"A": "1", "EMPTY": ""}


@pytest.mark.parametrize(("text", "out"), [
    ("$(A)", "1"),
    ("x$(A)y$(A)", "x1y1"),
    ("$(EMPTY)", ""),
    ("$$(A)", "$(A)"),
    ("$$$(A)", "$1"),
    ("$(B)", "$(B)"),
    ("$$", "$"),
    ("$A", "$A"),
    ("$(A", "$(A"),
    ("trailing$", "trailing$"),
    ("$()", "$()"),
])
def test_expand_follows_kubernetes(text: str, out: str) -> None:
    assert expand(text, VARS.get) == out


def test_mount_paths_are_rewritten_only_where_they_stand_as_paths() -> None:
    mounts = [("/data/cache", "/h/c"), ("/data", "/h/d")]
    assert rewrite_paths("/data", mounts) == "/h/d"
    assert rewrite_paths("--out=/data/x,/data/cache/y", mounts) == "--out=/h/d/x,/h/c/y"
    assert rewrite_paths("cat /data/a && ls /database /x/data", mounts) == "cat /h/d/a && ls /database /x/data"


def test_an_unknown_volume_type_is_refused_naming_the_volume(tmp_path: Path) -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"restartPolicy": "Never", "volumes": [{"name": "v", "nfs": {}}],
                                               "containers": [{"name": "main", "command": ["true"],
                                                               "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}}
    with pytest.raises(PodSpecError) as err:
        plan(pod, pod_dir=tmp_path, claims_dir=tmp_path, base_env={}, resolve_secret=lambda n, k: None,
             resolve_config_map=lambda n, k: None)
    assert err.value.reason == "CreateContainerConfigError"
    assert err.value.message.startswith("volume v: type ['nfs'] is not supported by the local kubelet")


def test_kubernetes_only_fields_are_named_as_config_keys() -> None:
    """What the renderer writes for Kubernetes and the host ignores is said, by the tau.yaml key that asked."""
    pod = {"metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname"}},
           "spec": {"priorityClassName": "research-high", "securityContext": {"runAsUser": 1000},
                    "containers": [{"name": "main", "command": ["true"]}]}}
    assert kubernetes_only(pod) == ("policy.pod_priority_class, policy.topology, "
                                    "runtime.security.run_as_user/run_as_group have no effect on the local "
                                    "backend (Kubernetes only)")
    assert kubernetes_only(pod, in_engine=True) == (
        "policy.pod_priority_class, policy.topology have no effect on the local backend (Kubernetes only)")
    assert kubernetes_only({"metadata": {}, "spec": {"containers": []}}) == ""
