"""The published bus contract (docs/asyncapi.yaml, docs/events.schema.json) is what the code generates, and
real payloads and headers validate against it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import msgspec
import nkeys
import yaml

from taugrid.access import delegation
from taugrid.bus.envelope import headers_for, sign_headers
from taugrid.bus.identity import new_user_seed
from taugrid.bus.topology import CONSUMERS, STREAMS
from taugrid.cli.asyncapi import asyncapi, dump, json_schema
from taugrid.core import contracts as c
from taugrid.core.contracts import NodeCordon, NodeRepair, NodeUncordon, NodeValidation
from taugrid.core.events import RUN_EVENTS, ce_type, run_subject
from taugrid.core.publishing import PERSON_REQUESTS, SERVICE_PUBLISH
from taugrid.health import wire

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


def _address_tokens(address: str) -> str:
    """A channel address as a subject whose parameters are single ``*`` tokens."""
    return ".".join("*" if t.startswith("{") else t for t in address.split("."))


def _covered(pattern: str, address: str) -> bool:
    """Whether a subject the platform publishes (a NATS pattern) can be a subject of the channel ``address``
    (parameters as ``*``): a pattern's ``*`` takes any token, a channel parameter any literal, and a trailing
    ``>`` the rest (one token or more); other tokens must be equal."""
    pat, addr = pattern.split("."), address.split(".")
    if pat[-1] == ">":
        if len(addr) < len(pat):  # ">" needs at least one token
            return False
        pat = pat[:-1]
        addr = addr[:len(pat)]
    elif len(pat) != len(addr):
        return False
    return all(p == "*" or a == "*" or p == a for p, a in zip(pat, addr, strict=True))


def test_every_subject_the_platform_publishes_or_consumes_is_in_the_contract() -> None:
    addresses = [_address_tokens(ch["address"]) for ch in asyncapi()["channels"].values()]
    published = {p for patterns in SERVICE_PUBLISH.values() for p in patterns} | set(PERSON_REQUESTS)
    consumed = {f for spec in CONSUMERS.values() for f in spec.filters}
    stored = {s for spec in STREAMS for s in spec.subjects if not s.startswith("$JS.")}  # the server's advisories
    missing = sorted(p for p in published | consumed | stored if not any(_covered(p, a) for a in addresses))
    assert missing == []
    # and the other way round: a channel nobody publishes is not in the contract (the DLQ is every consumer's)
    unpublished = sorted(a for a in addresses
                         if not a.startswith("dlq.") and not any(_covered(p, a) for p in published))
    assert unpublished == []
    for address in ("node.*.cordon", "node.*.uncordon", "node.*.validation", "node.*.repair", "dlq.*.*"):
        assert address in addresses


def test_node_health_payloads_are_published_with_their_schemas() -> None:
    doc, schema = asyncapi(), json_schema()
    for what, struct in [("cordon", NodeCordon), ("uncordon", NodeUncordon), ("validation", NodeValidation),
                         ("repair", NodeRepair)]:
        message = doc["components"]["messages"][f"node.{what}"]
        assert message["title"] == ce_type(what, family="node") == f"io.taugrid.node.{what}.v1"
        assert message["payload"] == {"$ref": f"#/components/schemas/{struct.__name__}"}
        assert doc["channels"][f"node.{what}"]["address"] == f"node.{{node}}.{what}"
        assert schema["x-taugrid-events"][f"io.taugrid.node.{what}.v1"] == {"$ref": f"#/$defs/{struct.__name__}"}
    assert wire.NodeCordon is NodeCordon and wire.NodeRepair is NodeRepair  # one definition, re-exported
    real = [NodeCordon(node="n1", reason="GpuXidError: xid 79", drain=True, conditions=["GpuXidError/0"], time=1.0),
            NodeUncordon(node="n1", reason="validated", time=2.0),
            NodeValidation(node="n1", ok=True, detail="2 GPUs answered", time=3.0, gpus=2),
            NodeRepair(node="n1", step="gpu-reset", ok=False, outcome="a process holds GPU 0", attempt=1, gpus=[0])]
    for payload in real:
        _validator(type(payload).__name__).validate(json.loads(msgspec.json.encode(payload)))
    errors = list(_validator("NodeRepair").iter_errors({"node": "n1", "step": "gpu-reset", "ok": "yes"}))
    assert sorted(e.message for e in errors) == ["'outcome' is a required property", "'yes' is not of type 'boolean'"]


def test_a_delegated_cancel_validates_against_the_published_headers() -> None:
    doc = asyncapi()
    person, portal = new_user_seed(), new_user_seed()
    token = delegation.issue(person, delegate=nkeys.from_seed(portal).public_key.decode(), ttl_s=3600)
    body = msgspec.json.encode(c.CancelRequested(reason="cancelled in the portal"))
    headers = headers_for(event_id="x-1.1.cancel.requested.ab12", event_type="cancel.requested",
                          source="/svc/portal", subject="x-1", workspace="default", attempt=1, traceparent="")
    headers[delegation.HEADER] = token
    sign_headers(portal, nats_subject=run_subject("default", "x-1", "cancel.requested"), headers=headers, body=body)
    validator = jsonschema.Draft202012Validator(doc["components"]["schemas"]["SignedRequestHeaders"])
    validator.validate(headers)
    errors = list(validator.iter_errors({**headers, delegation.HEADER: "not a token"}))
    assert [e.message for e in errors] == [
        "'not a token' does not match '^[A-Za-z0-9_-]+\\\\.[A-Za-z0-9_-]{86}$'"]
    assert "## Delegation" in doc["info"]["description"] and delegation.SCHEME in doc["info"]["description"]
