"""No stuck runs: a pod that cannot start fails once with its reason and releases its quota."""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from taugrid.bus import Bus, connect, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.platformread import PlatformReader
from taugrid.bus.replay import replay
from taugrid.bus.topology import SOURCES_STORE
from taugrid.core.contracts import BackendApply, PolicyApproved, WatchEvent
from taugrid.core.errors import ConfigError, TemporaryError
from taugrid.local.controller import LocalCluster
from taugrid.stack import natsserver
from tests.hardening.conftest import Stack
from tests.inprocess import one_node_cluster, private_server
from tests.local.test_controller import PLATFORM, job, main, until_finished


@pytest.fixture(scope="module")
async def bootstrapped(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A server of this module's own (``bus`` connects to it): the local cluster loads every workload its bucket
    holds, and the session's server holds whatever other modules' tests left there, in an order that depends on
    which tests ran before on this worker; the queue below is asserted empty."""
    async with private_server(tmp_path_factory.mktemp("stuck")) as (url, _):
        yield url


@pytest.fixture
async def cluster(bus: Bus, tmp_path: Path) -> AsyncIterator[LocalCluster]:
    await platformstore.put_text(bus, PLATFORM)
    c = await one_node_cluster(bus, tmp_path)
    yield c
    await c.kubelet.close()


def evil_tarball() -> bytes:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../escape.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    return archive.getvalue()


async def test_a_refused_source_snapshot_fails_the_pod_once_and_frees_the_quota(
        bus: Bus, cluster: LocalCluster, tmp_path: Path) -> None:
    rid = f"stuck-{uuid.uuid4().hex[:8]}"
    name = f"{rid}-a1"
    evil = evil_tarball()
    source = f"sources/{hashlib.sha256(evil).hexdigest()}.tar.gz"  # content-addressed, as every snapshot
    await (await bus.objects(SOURCES_STORE)).put(source, evil)
    manifest = job(name, main(["python3", "train.py"]))
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[manifest],
                                     source_object=source))
    started = time.monotonic()
    await until_finished(cluster, name, timeout=30)
    for _ in range(10):  # more ticks after it finished: nothing more happens for it
        await cluster.tick()
    assert time.monotonic() - started < 30
    pods = [msgspec.json.decode(m.data, type=WatchEvent).object
            for m in await replay(bus, stream="K8S", subject=f"k8s.local.pod.default.{name}-pod.>")]
    failed = [p for p in pods if p.get("status", {}).get("phase") == "Failed"]
    assert len(failed) == 1
    terminated = failed[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "CreateContainerError"
    assert terminated["message"].startswith(f"source snapshot {source} cannot be unpacked: ")
    assert "is outside the destination" in terminated["message"]
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path.parent / "escape.txt").exists()
    assert name not in cluster.wls
    [queue] = cluster.admitter.snapshot(time.time())
    assert (queue["admitted"], queue["used"], queue["pending"]) == (0, {}, [])


async def test_the_deadline_counts_from_admission_while_the_pod_is_still_prepared(
        bus: Bus, cluster: LocalCluster) -> None:
    from taugrid.local.runtime import Preparing
    from taugrid.local.state import LocalWorkload

    class NeverReady:
        def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Preparing:
            return Preparing("building the environment")

        def forget(self, pod: str) -> None:
            return None

    cluster.podsync.runtime = NeverReady()
    rid = f"late-{uuid.uuid4().hex[:8]}"
    name = f"{rid}-a1"
    manifest = job(name, main(["python3", "-c", "print(1)"]))
    manifest["spec"]["activeDeadlineSeconds"] = 2
    started = time.monotonic()
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[manifest]))
    await until_finished(cluster, name, timeout=30)
    assert 2 <= time.monotonic() - started < 10
    pods = [msgspec.json.decode(m.data, type=WatchEvent).object
            for m in await replay(bus, stream="K8S", subject=f"k8s.local.pod.default.{name}-pod.>")]
    terminated = pods[-1]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pods[-1]["status"]["phase"], terminated["reason"]) == ("Failed", "DeadlineExceeded")
    assert terminated["message"] == "Job was active longer than specified deadline (2s) before its pod could start"


BAD_PLATFORM = "workspaces:\n  - {name: team-a, namespace: default\n"  # unbalanced flow mapping: not YAML


async def test_tau_platform_apply_refuses_an_invalid_platform(stack: Stack) -> None:
    before = await platformstore.get_text(stack.admin)
    with pytest.raises(ConfigError, match="not valid YAML"):
        await stack.client.platform_apply(BAD_PLATFORM)
    assert await platformstore.get_text(stack.admin) == before


async def test_services_keep_the_last_good_platform_when_a_bad_one_is_stored(stack: Stack) -> None:
    good_text, good = await platformstore.get_text(stack.admin)  # type: ignore[misc]
    bad = await platformstore.put_text(stack.admin, BAD_PLATFORM)  # written behind `tau platform apply`'s back
    try:
        run_id = await stack.client.submit_text("name: ok\nentrypoint: t.py\n", workspace="team-a", name="ok")
        evs = await stack.wait_for(run_id, {"policy.approved", "policy.rejected", "submit.rejected"})
        assert [e.type for e in evs] == ["submit.requested", "submit.accepted", "policy.approved"]
        assert evs[-1].payload(PolicyApproved).platform_revision == good
    finally:
        await platformstore.put_text(stack.admin, good_text)
    assert bad > good


async def test_with_no_valid_platform_a_run_waits_and_goes_on_once_it_is_fixed(tmp_path: Path) -> None:
    proc, port = natsserver.start(tmp_path / "nats", log_file=tmp_path / "nats.log")
    bus = await connect(f"nats://127.0.0.1:{port}", name="bootstrap")
    try:
        await bootstrap(bus)
        await platformstore.put_text(bus, BAD_PLATFORM)
        reader = PlatformReader(bus)
        with pytest.raises(TemporaryError) as err:
            await reader.get()
        assert str(err.value).startswith("the platform (revision 1) is invalid and no earlier revision is valid: "
                                          "platform.yaml@1:")
        assert str(err.value).endswith("apply a fixed one with `tau platform apply`")
        assert err.value.delay == 15.0
        fixed = await platformstore.put_text(bus, "workspaces: []\n")
        got = await reader.get()
        assert got is not None and got[1] == fixed
    finally:
        await bus.close()
        proc.terminate()
        proc.wait(timeout=10)
