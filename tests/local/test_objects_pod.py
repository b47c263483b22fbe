"""``objects.pod``: a pod's spec is the template's spec, copied (each pod is its own object: a kubelet sets its
``nodeName``, a retry its env), in the template's exact content."""

from __future__ import annotations

from typing import Any

from taugrid.local import objects


def job() -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11-slim", "command": ["python3", "sim.py"],
                 "env": [{"name": "SIMULATED_DURATION", "value": "0.2"}],
                 "resources": {"requests": {"cpu": "500m", "memory": "1Mi"}, "limits": {"memory": "1Mi"}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j-a1", "namespace": "default", "uid": "r-a1", "labels": {}},
            "spec": {"template": {"metadata": {"labels": {"app": "x"}},
                                  "spec": {"restartPolicy": "Never", "containers": [container],
                                           "volumes": [{"name": "scratch", "emptyDir": {}}]}}}}


def test_each_pod_gets_the_templates_spec_as_its_own_copy() -> None:
    owner = job()
    template = owner["spec"]["template"]["spec"]
    first = objects.pod(owner, name="j-a1-0", node="n1", index=0, at=1.0)
    second = objects.pod(owner, name="j-a1-1", node="n2", index=1, at=1.0)
    assert first["spec"] == {**template, "nodeName": "n1"}
    assert second["spec"] == {**template, "nodeName": "n2"}
    first["spec"]["containers"][0]["env"].append({"name": "TAU_RETRY_REASON", "value": "x"})
    first["spec"]["volumes"][0]["emptyDir"]["medium"] = "Memory"
    assert template == job()["spec"]["template"]["spec"]  # the Job's template is untouched
    assert second["spec"] == {**job()["spec"]["template"]["spec"], "nodeName": "n2"}  # and so is the other pod
