"""KubeBackend over real HTTP (kmock) with kubernetes-asyncio: server-side apply, delete, error mapping."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import make_api_client

JOBS = ("batch", "v1", "jobs")


def job_manifest(name: str = "train-3f2a1b-a1") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {
                "taugrid.io/managed-by": "taugrid",
                "taugrid.io/run-id": "train-3f2a1b",
                "kueue.x-k8s.io/queue-name": "team-a-lq",
            },
        },
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "python:3.11", "command": ["python", "train.py"]}
                    ],
                }
            },
        },
    }


def rayjob_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "ray-1-a1", "namespace": "team-a"},
        "spec": {"suspend": True, "shutdownAfterJobFinishes": True, "entrypoint": "python x.py"},
    }


def backend(api_client: Any, **kw: Any) -> KubeBackend:
    return KubeBackend(api_client, retry_cap_s=0.05, **kw)


async def test_apply_creates_then_reapply_is_a_no_op(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    kb = backend(api_client)
    await kb.apply([job_manifest(), rayjob_manifest()])
    stored = fake.objects[(JOBS, "team-a", "train-3f2a1b-a1")]
    rv, uid = stored["metadata"]["resourceVersion"], stored["metadata"]["uid"]
    assert (
        fake.objects[(("ray.io", "v1", "rayjobs"), "team-a", "ray-1-a1")]["spec"]["entrypoint"]
        == "python x.py"
    )
    first = fake.applies[0]
    assert first["content_type"].startswith("application/apply-patch+yaml")
    assert first["params"] == {"fieldManager": "taugrid", "force": "true"}

    await kb.apply([job_manifest()])  # a redelivered render.applied
    again = fake.objects[(JOBS, "team-a", "train-3f2a1b-a1")]
    assert (again["metadata"]["resourceVersion"], again["metadata"]["uid"]) == (rv, uid)
    assert len([r for (r, _, _) in fake.objects if r == JOBS]) == 1


async def test_apply_of_a_changed_manifest_updates_the_same_object(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    kb = backend(api_client)
    await kb.apply([job_manifest()])
    uid = fake.objects[(JOBS, "team-a", "train-3f2a1b-a1")]["metadata"]["uid"]
    changed = job_manifest()
    changed["spec"]["suspend"] = False
    stored = await kb.apply_one(changed)
    assert stored["spec"]["suspend"] is False
    assert stored["metadata"]["uid"] == uid
    assert int(stored["metadata"]["resourceVersion"]) > 101


async def test_apply_cluster_scoped_and_kueue_kinds(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    await backend(api_client).apply(
        [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": "gpu-cq"},
                "spec": {"namespaceSelector": {}},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "team-a-lq", "namespace": "team-a"},
                "spec": {"clusterQueue": "gpu-cq"},
            },
        ]
    )
    assert (("kueue.x-k8s.io", "v1beta2", "clusterqueues"), None, "gpu-cq") in fake.objects
    assert (("kueue.x-k8s.io", "v1beta2", "localqueues"), "team-a", "team-a-lq") in fake.objects


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (422, 'Job.batch "x" is invalid: spec.template.spec.containers[0].image: Required value'),
        (
            403,
            'jobs.batch is forbidden: User "system:serviceaccount:tau:renderer" cannot patch resource "jobs"',
        ),
        (409, "Operation cannot be fulfilled: conflict with managers"),
        (400, "json: cannot unmarshal string into Go struct field"),
    ],
)
async def test_client_errors_are_permanent_with_the_server_message(
    fake_kube: Any, status: int, message: str
) -> None:
    fake, api_client = fake_kube
    fake.fail("PATCH", status, message)
    with pytest.raises(PermanentError) as info:
        await backend(api_client).apply([job_manifest()])
    assert message in str(info.value) and "apply Job team-a/train-3f2a1b-a1" in str(info.value)
    assert not isinstance(info.value, TemporaryError)


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_throttling_and_server_errors_are_retried(fake_kube: Any, status: int) -> None:
    fake, api_client = fake_kube
    fake.fail("PATCH", status, "etcdserver: request timed out", times=2, headers={"Retry-After": "0"})
    await backend(api_client).apply([job_manifest()])
    assert (JOBS, "team-a", "train-3f2a1b-a1") in fake.objects
    assert len(fake.applies) == 1  # the two failures never reached the store


async def test_persistent_throttling_surfaces_as_temporary_with_retry_after(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.fail("PATCH", 429, "too many requests", times=10, headers={"Retry-After": "7"})
    with pytest.raises(TemporaryError) as info:
        await backend(api_client, retries=1).apply([job_manifest()])
    assert info.value.delay == 7.0 and "too many requests" in str(info.value)


async def test_object_being_deleted_is_temporary(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.fail("PATCH", 409, 'object is being deleted: jobs.batch "x" already exists', times=5)
    with pytest.raises(TemporaryError):
        await backend(api_client, retries=0).apply([job_manifest()])


async def test_unreachable_api_is_temporary() -> None:
    api_client = await make_api_client(host="http://127.0.0.1:9")  # discard port: connection refused
    try:
        with pytest.raises(TemporaryError) as info:
            await backend(api_client, retries=1).apply([job_manifest()])
        assert "cannot reach the Kubernetes API" in str(info.value)
    finally:
        await api_client.close()


async def test_manifest_without_namespace_is_rejected_before_any_call(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    bad = copy.deepcopy(job_manifest())
    del bad["metadata"]["namespace"]
    with pytest.raises(PermanentError, match="metadata.namespace is required"):
        await backend(api_client).apply([bad])
    assert fake.applies == []


async def test_delete_uses_background_propagation_and_tolerates_absence(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    kb = backend(api_client)
    await kb.apply([job_manifest()])
    await kb.delete("Job", "team-a", "train-3f2a1b-a1", grace_s=15)
    assert (JOBS, "team-a", "train-3f2a1b-a1") not in fake.objects
    assert fake.deletes[0]["body"]["propagationPolicy"] == "Background"
    assert fake.deletes[0]["body"]["gracePeriodSeconds"] == 15
    await kb.delete("Job", "team-a", "train-3f2a1b-a1", grace_s=15)  # already gone: fine
    await kb.delete("RayJob", "team-a", "never-existed")
    assert len(fake.deletes) == 3
    assert await kb.get("Job", "team-a", "train-3f2a1b-a1") is None


async def test_delete_forbidden_is_permanent(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.fail("DELETE", 403, 'jobs.batch "x" is forbidden')
    with pytest.raises(PermanentError, match="forbidden"):
        await backend(api_client).delete("Job", "team-a", "x")


async def test_backend_port_applies_and_deletes_requests(
    fake_kube: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taugrid.core.contracts import BackendApply, BackendDelete
    from taugrid.kube.backend import kube_backend_from_env

    fake, api_client = fake_kube
    monkeypatch.setenv("TAU_KUBE_HOST", api_client.configuration.host)
    port = await kube_backend_from_env()
    try:
        await port.apply(
            BackendApply(run_id="train-3f2a1b", workspace="team-a", attempt=1, manifests=[job_manifest()])
        )
        assert (JOBS, "team-a", "train-3f2a1b-a1") in fake.objects
        await port.delete(
            BackendDelete(
                run_id="train-3f2a1b",
                workspace="team-a",
                attempt=1,
                kind="Job",
                namespace="team-a",
                name="train-3f2a1b-a1",
                grace_s=5,
            )
        )
        assert (JOBS, "team-a", "train-3f2a1b-a1") not in fake.objects
    finally:
        await port.close()
