"""The renderer service stamps the chart's source-fetch settings (TAU_SOURCE_FETCH_* in its environment) onto
what it applies: the Job the emulated cluster receives fetches the run's snapshot with the chart's image."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from taugrid.bus import Bus
from taugrid.bus.envelope import Event
from taugrid.core.contracts import PolicyApproved, ResolvedRun
from taugrid.kube.apply import KubeBackend
from taugrid.kube.backend import KubernetesBackend
from taugrid_services.renderer.handlers import Renderer

JOBS = ("batch", "v1", "jobs")
DIGEST = "sha256:" + "7d" * 32


async def test_applied_pods_fetch_the_snapshot_with_the_charts_settings(
    bus: Bus, fake_kube: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAU_SOURCE_FETCH_IMAGE", "registry.example.com/taugrid:1.2.3")
    monkeypatch.setenv("TAU_SOURCE_FETCH_NATS_URL", "nats://taugrid-nats.taugrid.svc:4222")
    monkeypatch.setenv("TAU_SOURCE_FETCH_CREDS_SECRET", "tau-source-fetch")
    fake, api_client = fake_kube
    run = ResolvedRun(
        run_id=f"train-{uuid.uuid4().hex[:6]}", submission_id="s", workspace="team-a", namespace="team-a",
        name="train", local_queue="team-a-lq", cluster_queue="team-a-cq", config_hash="sha256:0c",
        source_digest=DIGEST, source_object=f"sources/{DIGEST[7:]}.tar.gz", command=["python3", "train.py"],
        entrypoint="train.py",
    )
    renderer = Renderer(bus, KubernetesBackend(KubeBackend(api_client, retries=0), "c"))
    ev = Event(id=f"{run.run_id}.1.policy.approved", type="policy.approved", source="/test", subject=run.run_id,
               time="", data=msgspec.json.encode(PolicyApproved(run=run)), workspace=run.workspace)
    await renderer.on_event(ev)

    pod = fake.objects[(JOBS, "team-a", f"{run.run_id}-a1")]["spec"]["template"]
    assert pod["metadata"]["annotations"]["taugrid.io/source-digest"] == DIGEST
    (fetch,) = pod["spec"]["initContainers"]
    env = {e["name"]: e.get("value") for e in fetch["env"]}
    assert (fetch["image"], env["TAU_NATS_URL"], env["TAU_SOURCE_OBJECT"], env["TAU_NATS_CREDS"]) == (
        "registry.example.com/taugrid:1.2.3", "nats://taugrid-nats.taugrid.svc:4222",
        f"sources/{DIGEST[7:]}.tar.gz", "/etc/taugrid/nats/creds")
    assert {"name": "tau-nats-creds", "secret": {"secretName": "tau-source-fetch",
                                                 "items": [{"key": "creds", "path": "creds"}],
                                                 "defaultMode": 0o440}} in pod["spec"]["volumes"]
    assert pod["spec"]["containers"][0]["workingDir"] == "/tau/source"
