"""A retry's ``exclude_nodes`` become a required hostname anti-affinity on every pod template,
deterministically; the renderer service's annotation stamping leaves the rendered manifests (and their
digest) alone."""

from __future__ import annotations

import copy
from typing import Any

from render_runs import build_run

from taugrid.core.contracts import ResolvedRun
from taugrid.render import (
    TRACEPARENT_ANNOTATION,
    manifest_digest,
    render,
    to_yaml,
    validate,
    with_annotation,
)

EXCLUDED = ["gpu-node-7", "gpu-node-2", "gpu-node-7", ""]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _ray() -> ResolvedRun:
    return build_run(run_id="ray-7c21d0", engine="ray", launcher="ray-train", command=[], workers=2,
                     gpus_per_worker=1)


def _torchrun() -> ResolvedRun:
    return build_run(launcher="torchrun", nodes=2)


def _pod_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "Job":
        return [manifest["spec"]["template"]]
    if manifest["kind"] == "RayJob":
        cluster = manifest["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    return []


def _excluded_hosts(template: dict[str, Any]) -> list[str]:
    terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 1  # terms are ORed: a second one would let the pod back onto an excluded node
    (expr,) = terms[0]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/hostname" and expr["operator"] == "NotIn"
    return list(expr["values"])


def test_every_pod_template_of_every_shape_avoids_the_excluded_nodes_and_validates() -> None:
    for run in (build_run(), _torchrun(), _ray()):
        manifests = render(run, attempt=2, exclude_nodes=EXCLUDED)
        templates = [t for m in manifests for t in _pod_templates(m)]
        assert len(templates) == (2 if run.engine == "ray" else 1)
        for template in templates:
            assert _excluded_hosts(template) == ["gpu-node-2", "gpu-node-7"]
        for manifest in manifests:
            validate(manifest)


def test_same_exclusions_render_identical_manifests_whatever_their_order() -> None:
    for run in (build_run(), _torchrun(), _ray()):
        first = render(run, attempt=3, resume_from="/data/ckpt/step-100", exclude_nodes=EXCLUDED)
        again = render(run, attempt=3, resume_from="/data/ckpt/step-100", exclude_nodes=EXCLUDED[::-1])
        assert first == again
        assert to_yaml(first) == to_yaml(again)
        assert manifest_digest(first) == manifest_digest(again)
        assert manifest_digest(first) != manifest_digest(
            render(run, attempt=3, resume_from="/data/ckpt/step-100")
        )


def test_no_exclusions_render_no_affinity_at_all() -> None:
    for run in (build_run(), _torchrun(), _ray()):
        plain = render(run, attempt=1)
        assert plain == render(run, attempt=1, exclude_nodes=())
        assert plain == render(run, attempt=1, exclude_nodes=[""])
        assert all("affinity" not in t["spec"] for m in plain for t in _pod_templates(m))


def test_annotation_stamping_copies_objects_and_pod_templates_and_leaves_the_rendered_digest() -> None:
    for run in (build_run(), _torchrun(), _ray()):
        rendered = render(run, attempt=2, exclude_nodes=EXCLUDED)
        before = copy.deepcopy(rendered)
        digest = manifest_digest(rendered)
        stamped = with_annotation(rendered, TRACEPARENT_ANNOTATION, TRACEPARENT)
        assert rendered == before and manifest_digest(rendered) == digest  # the input is untouched
        for manifest in stamped:
            assert manifest["metadata"]["annotations"][TRACEPARENT_ANNOTATION] == TRACEPARENT
            for template in _pod_templates(manifest):
                assert template["metadata"]["annotations"][TRACEPARENT_ANNOTATION] == TRACEPARENT
            validate(manifest)
        # Only the annotation differs: remove it and the rendered manifests come back.
        for manifest in stamped:
            manifest["metadata"]["annotations"].pop(TRACEPARENT_ANNOTATION)
            for template in _pod_templates(manifest):
                template["metadata"]["annotations"].pop(TRACEPARENT_ANNOTATION)
        assert stamped == rendered
