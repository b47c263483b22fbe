"""Watch changes carry the object less what no consumer reads (``core/watched.py``): every translation and
progress test passes with its objects slimmed, and a real-looking pod, Workload and Job keep exactly the fields
the admission watcher reads."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from taugrid.core import contracts as c
from taugrid.core.watched import LAST_APPLIED, PROVENANCE, slim
from taugrid.kube.translate import translate
from tests.kube import test_progress, test_translate

LABELS = {"taugrid.io/run-id": "r1", "taugrid.io/workspace": "ws", "taugrid.io/attempt": "1"}
MANAGED = [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {"f:containers": {}}}}]


@pytest.mark.parametrize(("module", "helper"), [(test_translate, "ev"), (test_progress, "watch")])
def test_every_translation_and_progress_test_passes_on_slimmed_objects(
    module: ModuleType, helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original: Callable[..., c.WatchEvent] = getattr(module, helper)
    seen: list[dict[str, Any]] = []

    def slimmed(obj: dict[str, Any], *args: Any, **kwargs: Any) -> c.WatchEvent:
        seen.append(obj)
        return original(slim(obj), *args, **kwargs)

    monkeypatch.setattr(module, helper, slimmed)
    ran = 0
    for name, fn in sorted(vars(module).items()):
        if name.startswith("test_") and inspect.isfunction(fn) and not inspect.signature(fn).parameters:
            fn()
            ran += 1
    assert ran >= 10 and len(seen) >= 10  # the modules' tests ran, through the slimmed helper


def test_a_real_looking_pod_keeps_its_node_and_container_images_and_loses_the_rest() -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "r1-a1-0", "namespace": "team-a", "uid": "u1", "resourceVersion": "9",
                     "labels": LABELS, "managedFields": MANAGED,
                     "annotations": {LAST_APPLIED: "{...}", "taugrid.io/traceparent": "00-ab-cd-01"},
                     "ownerReferences": [{"kind": "Job", "name": "r1-a1", "uid": "j1"}]},
        "spec": {"nodeName": "gpu-3", "restartPolicy": "Never", "volumes": [{"name": "data", "emptyDir": {}}],
                 "initContainers": [{"name": "fetch-source", "image": "tau:1", "args": ["--digest", "x"]}],
                 "containers": [{"name": "main", "image": "train:1", "command": ["python", "t.py"],
                                 "env": [{"name": "A", "value": "1"}], "resources": {"limits": {"cpu": "1"}}}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "main", "ready": True}]},
    }
    assert slim(pod) == {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "r1-a1-0", "namespace": "team-a", "uid": "u1", "resourceVersion": "9",
                     "labels": LABELS, "annotations": {"taugrid.io/traceparent": "00-ab-cd-01"},
                     "ownerReferences": [{"kind": "Job", "name": "r1-a1", "uid": "j1"}]},
        "spec": {"nodeName": "gpu-3", "initContainers": [{"name": "fetch-source", "image": "tau:1"}],
                 "containers": [{"name": "main", "image": "train:1"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "main", "ready": True}]},
    }
    assert "managedFields" in pod["metadata"] and "env" in pod["spec"]["containers"][0]  # left as it was


def test_a_workload_keeps_its_queue_active_flag_and_pod_set_template_metadata_and_a_job_no_spec() -> None:
    template = {"metadata": {"labels": {"taugrid.io/managed-by": "taugrid"}},
                "spec": {"containers": [{"name": "main", "image": "train:1", "env": [{"name": "A", "value": "1"}]}]}}
    wl = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
          "metadata": {"name": "job-r1-a1", "namespace": "team-a", "uid": "w1"},
          "spec": {"queueName": "lq", "priority": 100, "active": True,
                   "podSets": [{"name": "main", "count": 2, "template": template, "minCount": 1}]},
          "status": {"conditions": []}}
    assert slim(wl)["spec"] == {"queueName": "lq", "active": True, "podSets": [
        {"name": "main", "count": 2, "template": {"metadata": {"labels": {"taugrid.io/managed-by": "taugrid"}}}}]}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "r1-a1", "uid": "j1", "labels": LABELS},
           "spec": {"template": template, "completions": 1}, "status": {"succeeded": 1}}
    assert slim(job) == {"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": "r1-a1", "uid": "j1", "labels": LABELS}, "status": {"succeeded": 1}}
    assert translate(c.WatchEvent(type="MODIFIED", object=slim(job))) == translate(
        c.WatchEvent(type="MODIFIED", object=job))
    event = {"apiVersion": "v1", "kind": "Event", "reason": "FailedScheduling", "note": "0/3 nodes",
             "regarding": {"kind": "Pod", "name": "r1-a1-0"}, "spec": {"kept": True}}
    assert slim(event) == event  # kinds the module does not know go as they are


def test_a_job_loses_the_renderers_provenance_annotations_and_keeps_those_the_watcher_reads() -> None:
    kept = {"taugrid.io/traceparent": "00-ab-cd-01", "taugrid.io/run-labelled": "true",
            "taugrid.io/queue-position": "3", "environment.taugrid.io/cuda": "12.4"}
    provenance = {"taugrid.io/config-hash": "df63" * 16, "taugrid.io/source-digest": "", "taugrid.io/workspace": "ws",
                  "taugrid.io/submission-id": "1a23421b8d8727833a71744", "taugrid.io/run-name": "store"}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "r1-a1", "uid": "j1", "labels": LABELS, "annotations": {**provenance, **kept}},
           "status": {"active": 1}}
    assert set(provenance) == PROVENANCE
    assert slim(job)["metadata"] == {"name": "r1-a1", "uid": "j1", "labels": LABELS, "annotations": kept}
    assert translate(c.WatchEvent(type="MODIFIED", object=slim(job))) == translate(
        c.WatchEvent(type="MODIFIED", object=job))


def test_empty_strings_in_conditions_and_container_states_are_left_out_as_kubernetes_does() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "r1-a1-0", "labels": LABELS},
           "status": {"phase": "Succeeded",
                      "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "message": "",
                                      "lastTransitionTime": "2026-12-02T00:22:35Z"}],
                      "containerStatuses": [{"name": "main", "ready": False, "restartCount": 0,
                                             "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                                      "message": ""}}}]}}
    assert slim(pod)["status"] == {
        "phase": "Succeeded",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                        "lastTransitionTime": "2026-12-02T00:22:35Z"}],
        "containerStatuses": [{"name": "main", "ready": False, "restartCount": 0,
                               "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
    assert translate(c.WatchEvent(type="MODIFIED", object=slim(pod))) == translate(
        c.WatchEvent(type="MODIFIED", object=pod))
