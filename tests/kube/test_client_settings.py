"""``kube.client.api_client_for``: the one way a process builds its Kubernetes client from its settings: an explicit
``TAU_KUBE_HOST``, else the kubeconfig (``TAU_KUBECONFIG``, else ``KUBECONFIG``) at ``TAU_KUBE_CONTEXT``'s context;
a kubeconfig that cannot be read is a ``PermanentError`` naming the ways to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from taugrid.core.errors import PermanentError
from taugrid.kube.client import api_client_for
from taugrid.settings import Settings

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- {name: one, cluster: {server: "https://one.example:6443"}}
- {name: two, cluster: {server: "https://two.example:6443"}}
users: [{name: u, user: {token: t}}]
contexts:
- {name: first, context: {cluster: one, user: u}}
- {name: second, context: {cluster: two, user: u}}
current-context: first
"""


async def test_an_explicit_host_wins() -> None:
    kube = Settings.from_env({"TAU_KUBE_HOST": "http://127.0.0.1:9", "KUBECONFIG": "/nonexistent"}).kube
    client = await api_client_for(kube)
    try:
        assert client.configuration.host == "http://127.0.0.1:9"
    finally:
        await client.close()


@pytest.mark.parametrize(("env", "host"), [
    ({"KUBECONFIG": "{path}"}, "https://one.example:6443"),
    ({"TAU_KUBECONFIG": "{path}", "KUBECONFIG": "/nonexistent", "TAU_KUBE_CONTEXT": "second"},
     "https://two.example:6443"),
])
async def test_the_kubeconfig_and_its_context(tmp_path: Path, env: dict[str, str], host: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    kube = Settings.from_env({k: v.format(path=path) for k, v in env.items()}).kube
    client = await api_client_for(kube)
    try:
        assert client.configuration.host == host
    finally:
        await client.close()


async def test_an_unreadable_kubeconfig_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text("clusters: [")
    kube = Settings.from_env({"TAU_KUBECONFIG": str(tmp_path / "kubeconfig")}).kube
    with pytest.raises(PermanentError, match=r"(?s)cannot configure the Kubernetes client .*set `kubeconfig:` in "
                                             r"platform.yaml, \$KUBECONFIG, or run inside the cluster"):
        await api_client_for(kube)
