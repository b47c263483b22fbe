"""A local workload's record (``taugrid.local.state``): the Job held as JSON while it waits, as a dict once used,
and written to the record as it is at each save."""

from __future__ import annotations

from typing import Any

import msgspec

from taugrid.local.state import LocalWorkload

JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j-a1", "namespace": "default"},
       "spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "main", "image": "python:3.11"}]}}}}


def record(job: dict[str, Any]) -> bytes:
    """A record as the local cluster wrote it before the Job was held as JSON: the Job an object under ``job``."""
    return msgspec.json.encode({"name": "j-a1", "namespace": "default", "uid": "r-a1", "run_id": "r",
                                "workspace": "default", "attempt": 1, "job": job, "workload": {},
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
    wl.keep_job(mine)
    assert wl.job is mine and wl.job_view() is mine
