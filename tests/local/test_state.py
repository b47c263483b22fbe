"""A local workload's record (``taugrid.local.state``): the Job and the Workload held as JSON while it waits, as
dicts once used, and written to the record as they are at each save."""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from taugrid.local.state import LocalPod, LocalWorkload

JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j-a1", "namespace": "default"},
       "spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "main", "image": "python:3.11"}]}}}}


WORKLOAD = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": {"name": "job-j-a1"},
            "spec": {"queueName": "default"}}


def record(job: dict[str, Any]) -> bytes:
    """A record as the local cluster wrote it before the Job was held as JSON: the Job an object under ``job``."""
    return msgspec.json.encode({"name": "j-a1", "namespace": "default", "uid": "r-a1", "run_id": "r",
                                "workspace": "default", "attempt": 1, "job": job, "workload": WORKLOAD,
                                "cluster_queue": "cq", "priority": 0, "created": 1.0, "pods_wanted": 2,
                                "per_pod": {"cpu": 1.0}})


def test_a_record_read_back_holds_its_job_as_json_until_the_job_is_used() -> None:
    wl = msgspec.json.decode(record(JOB), type=LocalWorkload)
    assert not wl.job_decoded
    assert wl.job_view() == JOB
    assert not wl.job_decoded  # a look does not keep the dict
    assert wl.job == JOB
    assert wl.job_decoded


def test_a_change_to_the_job_is_in_the_next_record_and_survives_packing() -> None:
    wl = msgspec.json.decode(record(JOB), type=LocalWorkload)
    wl.job["status"] = {"active": 2}
    wl.sync()
    assert msgspec.json.decode(msgspec.json.encode(wl))["job"] == {**JOB, "status": {"active": 2}}
    wl.job["status"]["active"] = 1
    wl.pack()
    assert not wl.job_decoded
    assert msgspec.json.decode(msgspec.json.encode(wl), type=LocalWorkload).job == {**JOB, "status": {"active": 1}}


def test_a_kept_job_is_the_one_every_reader_sees() -> None:
    wl = msgspec.json.decode(record(JOB), type=LocalWorkload)
    mine = {**JOB, "metadata": {"name": "j-a1", "namespace": "default", "uid": "r-a1"}}
    theirs = {**WORKLOAD, "status": {"conditions": []}}
    wl.keep(job=mine, workload=theirs)
    assert wl.job is mine and wl.job_view() is mine
    assert wl.workload is theirs and wl.workload_view() is theirs
    wl.pack()
    assert (wl.job, wl.workload) == (mine, theirs)


def test_the_workload_is_held_as_the_job_is() -> None:
    wl = msgspec.json.decode(record(JOB), type=LocalWorkload)
    assert wl.workload_view() == WORKLOAD and not wl.workload_decoded
    wl.workload["status"] = {"admission": {"clusterQueue": "cq"}}
    assert wl.workload_decoded and not wl.job_decoded
    wl.pack()
    assert not wl.workload_decoded
    assert msgspec.json.decode(msgspec.json.encode(wl))["workload"] == {**WORKLOAD, **wl.workload}


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j-a1-0", "uid": "pod-j-a1-0"},
       "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}}


def test_a_packed_workload_and_its_pods_keep_no_table_for_their_dropped_dicts() -> None:
    """An emptied ``__dict__`` is cleared: one held per waiting workload and per running pod (issue 27)."""
    wl = msgspec.json.decode(record(JOB), type=LocalWorkload)
    pod = LocalPod.holding(POD, name="j-a1-0", index=0, node="node-1")
    wl.pods.append(pod)
    wl.job["status"] = {"active": 1}
    wl.workload["status"] = {}
    assert sys.getsizeof(wl.__dict__) > sys.getsizeof({})
    wl.pack()
    assert (wl.__dict__, pod.__dict__) == ({}, {})
    assert (sys.getsizeof(wl.__dict__), sys.getsizeof(pod.__dict__)) == (sys.getsizeof({}), sys.getsizeof({}))
    assert wl.job["status"] == {"active": 1} and pod.obj == POD  # decoded again on use


def test_a_new_pod_is_written_to_the_record_as_it_is_at_the_save_and_packed_with_its_workload() -> None:
    wl = msgspec.json.decode(record(JOB), type=LocalWorkload)
    pod = LocalPod.holding(POD, name="j-a1-0", index=0, node="node-1")
    wl.pods.append(pod)
    assert pod.obj is POD and pod.obj_decoded and wl.decoded
    wl.sync()
    assert msgspec.json.decode(msgspec.json.encode(wl))["pods"][0]["obj"] == POD
    pod.obj["status"]["phase"] = "Succeeded"
    wl.pack()
    assert not pod.obj_decoded and not wl.decoded
    back = msgspec.json.decode(msgspec.json.encode(wl), type=LocalWorkload)
    assert back.pods[0].obj == {**POD, "status": {"phase": "Succeeded"}}
    assert back.pods[0].obj_decoded and not back.pods[1:]  # read back as JSON, decoded (and kept) on its first use


def test_a_record_written_before_pods_were_held_as_json_reads_the_same() -> None:
    old = msgspec.json.decode(record(JOB))
    old["pods"] = [{"name": "j-a1-0", "index": 0, "obj": POD, "phase": "Running", "node": "node-1"}]
    wl = msgspec.json.decode(msgspec.json.encode(old), type=LocalWorkload)
    assert not wl.decoded
    assert wl.pods[0].obj == POD and wl.pods[0].phase == "Running"
