"""The published bus contract (docs/asyncapi.yaml, docs/events.schema.json) is what the code generates, and
real payloads and headers validate against it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import msgspec
import yaml

from taugrid.bus.asyncapi import asyncapi, dump, json_schema
from taugrid.bus.envelope import headers_for, sign_headers
from taugrid.bus.identity import new_user_seed
from taugrid.core import contracts as c
from taugrid.core.events import RUN_EVENTS, ce_type, run_subject

REPO = Path(__file__).resolve().parents[2]
TAU = [sys.executable, "-m", "taugrid.cli.main"]


def test_committed_documents_equal_the_generated_ones() -> None:
    assert (REPO / "docs" / "asyncapi.yaml").read_text() == dump(asyncapi(), "yaml"), \
        "docs/asyncapi.yaml drifted: run `tau events schema > docs/asyncapi.yaml`"
    assert (REPO / "docs" / "events.schema.json").read_text() == dump(json_schema(), "json"), \
        "docs/events.schema.json drifted: run `tau events schema --format jsonschema > docs/events.schema.json`"


def test_cli_prints_both_documents_offline() -> None:
    env = {"TAU_NATS_URL": "nats://127.0.0.1:1"}  # nothing listens there: the command must not need the bus
    out = subprocess.run([*TAU, "events", "schema"], capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, **env}, check=True).stdout
    assert out == (REPO / "docs" / "asyncapi.yaml").read_text()
    out = subprocess.run([*TAU, "events", "schema", "--format", "jsonschema", "--output", "yaml"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert yaml.safe_load(out) == json.loads((REPO / "docs" / "events.schema.json").read_text())
    bad = subprocess.run([*TAU, "events", "schema", "--format", "openapi"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "'openapi' is not one of 'asyncapi', 'jsonschema'" in bad.stderr


def test_every_run_event_has_a_channel_message_and_schema() -> None:
    doc = asyncapi()
    schema = json_schema()
    for kind, struct in RUN_EVENTS.items():
        message = doc["components"]["messages"][f"run.{kind}"]
        assert message["title"] == ce_type(kind)
        assert message["payload"] == {"$ref": f"#/components/schemas/{struct.__name__}"}
        assert struct.__name__ in doc["components"]["schemas"]
        assert schema["x-taugrid-events"][ce_type(kind)] == {"$ref": f"#/$defs/{struct.__name__}"}
        stage, outcome = kind.split(".")
        assert doc["channels"][f"run.{kind}"]["address"] == f"run.{{workspace}}.{{run_id}}.{stage}.{outcome}"
    assert doc["operations"]["submit"]["action"] == "send"
    assert doc["operations"]["cancel"]["action"] == "send"
    assert doc["operations"]["on.exec.succeeded"]["action"] == "receive"
    assert doc["x-taugrid-streams"]["RUNS"]["subjects"] == ["run.>"]


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json_schema()
    return jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{name}"})


def test_real_payloads_validate_and_wrong_ones_do_not() -> None:
    req = c.SubmitRequested(submission_id="s1", config_text="name: x\n", workspace="default")
    _validator("SubmitRequested").validate(json.loads(msgspec.json.encode(req)))
    run = c.ResolvedRun(run_id="x-1", submission_id="s1", workspace="default", namespace="default", name="x")
    _validator("PolicyApproved").validate(json.loads(msgspec.json.encode(c.PolicyApproved(run=run))))
    errors = list(_validator("SubmitRequested").iter_errors({"config_text": 3}))
    assert sorted(e.message for e in errors) == ["'submission_id' is a required property",
                                                 "3 is not of type 'string'"]


def test_signed_request_headers_validate_against_the_published_header_schema() -> None:
    doc = asyncapi()
    body = msgspec.json.encode(c.SubmitRequested(submission_id="s1", config_text="name: x\n"))
    headers = headers_for(event_id="x-1.1.submit.requested", event_type="submit.requested", source="/svc/client",
                          subject="x-1", workspace="default", attempt=1, traceparent="")
    sign_headers(new_user_seed(), nats_subject=run_subject("default", "x-1", "submit.requested"),
                 headers=headers, body=body)
    jsonschema.Draft202012Validator(doc["components"]["schemas"]["SignedRequestHeaders"]).validate(headers)
    unsigned = {k: v for k, v in headers.items() if not k.startswith("tau-")}
    errors = list(jsonschema.Draft202012Validator(doc["components"]["schemas"]["SignedRequestHeaders"])
                  .iter_errors(unsigned))
    assert sorted(e.message for e in errors) == ["'tau-signature' is a required property",
                                                 "'tau-signer' is a required property"]
