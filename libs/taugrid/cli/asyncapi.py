"""The bus contract for clients in any language, generated from the code that defines it.

Two documents, both built here and nowhere else (``tau events schema``; committed as ``docs/asyncapi.yaml`` and
``docs/events.schema.json``, and a test keeps the committed files equal to these):

* a JSON Schema (draft 2020-12) of every payload, from the msgspec Structs in ``taugrid.core.contracts`` via
  ``msgspec.json.schema_components`` — the Structs are the only definition;
* an AsyncAPI 3.0 document: the subjects (``taugrid.core.events``), the streams that store them
  (``taugrid.bus.topology``), the CloudEvents binary-mode headers (``taugrid.bus.envelope``) and how a person
  signs ``submit.requested`` / ``cancel.requested``.

Pure functions: nothing here touches the network or the disk.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import yaml

from taugrid import __version__
from taugrid.access import delegation
from taugrid.bus.dlq import ADVISORY_PREFIX
from taugrid.bus.dlq import STREAM as DLQ_STREAM
from taugrid.bus.envelope import (
    DEDUP_KEY_CHARS,
    DELEGATION_HEADER,
    SIGNATURE_HEADER,
    SIGNATURE_MAX_AGE_S,
    SIGNATURE_SCHEME,
    SIGNED_TYPES,
    SIGNER_HEADER,
    SPEC_VERSION,
    USER_HEADER,
)
from taugrid.bus.topology import (
    AUDIT_FILTERS,
    AUDIT_KEPT_EVENTS,
    AUDIT_MAX_AGE,
    AUDIT_PREFIX,
    AUDIT_STREAM,
    FEEDS,
    HISTORY_PREFIX,
    HISTORY_STREAM,
    OBJECT_STORE,
    SOURCES_STORE,
    STREAMS,
    UPLOADS_STORE,
    UPLOADS_TTL_S,
)
from taugrid.core import contracts as c
from taugrid.core.events import CE_PREFIX, HIGH_LANE, LANED_EVENTS, RUN_EVENTS, TERMINAL_EVENTS, ce_type

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Subjects outside the run lifecycle whose payloads are core contracts: (channel id, address, parameters,
# payload, CloudEvents type short form, family, stream, who publishes it).
OTHER_CHANNELS: list[tuple[str, str, dict[str, str], type[msgspec.Struct], str, str, str, str]] = [
    ("log", "log.{workspace}.{run_id}.{attempt}", {"attempt": "the run's attempt, from 1"}, c.LogChunk,
     "chunk", "log", "LOGS", "the log shipper: a run's output, in order per pod (`seq`)"),
    ("backend.apply", "backend.{cluster}.apply", {}, c.BackendApply, "apply", "backend", "BACKEND",
     "the renderer: a request to a backend (`local` on the embedded stack) to create a run's objects"),
    ("backend.apply.high", "backend.{cluster}.apply.high", {}, c.BackendApply, "apply", "backend", "BACKEND",
     "the renderer: the apply of a high priority lane run, read by the local cluster's own durable for it"),
    ("backend.reserve", "backend.{cluster}.reserve", {}, c.BackendApply, "reserve", "backend", "BACKEND",
     "the dispatcher (many clusters): queue a run's workload and reserve quota for it, start nothing; the cluster "
     "that reserves first gets the run's apply, the others a delete"),
    ("backend.reserve.high", "backend.{cluster}.reserve.high", {}, c.BackendApply, "reserve", "backend", "BACKEND",
     "the dispatcher: the reservation of a high priority lane run"),
    ("backend.delete", "backend.{cluster}.delete", {}, c.BackendDelete, "delete", "backend", "BACKEND",
     "the renderer: a request to a backend to delete a run's object"),
    ("k8s", "k8s.{cluster}.{kind}.{namespace}.{name}.{change}",
     {"kind": "lower-case object kind", "namespace": "`_` for cluster-scoped objects",
      "name": "object name", "change": "added | modified | deleted"},
     c.WatchEvent, "watch", "k8s", "K8S", "the Kubernetes bridge or the local cluster: one watch change"),
    ("k8s.high", "k8s.{cluster}.{kind}.{namespace}.{name}.{change}.high",
     {"kind": "lower-case object kind", "namespace": "`_` for cluster-scoped objects",
      "name": "object name", "change": "added | modified | deleted"},
     c.WatchEvent, "watch", "k8s", "K8S",
     "the local cluster: one watch change of a high priority lane run's object (read by its own durable)"),
    ("node.sample", "node.{node}.sample", {}, c.NodeSample, "sample", "node", "NODES",
     "the node agent: one health sample of a machine"),
    ("node.condition", "node.{node}.condition.{type}", {"type": "the condition, e.g. GpuXidError"},
     c.NodeCondition, "condition", "node", "NODES", "the health monitor: a node condition changed"),
    ("node.cordon", "node.{node}.cordon", {}, c.NodeCordon, "cordon", "node", "NODES",
     "the health monitor: no new work on the node (with `drain`, its running runs are stopped and retried "
     "elsewhere)"),
    ("node.uncordon", "node.{node}.uncordon", {}, c.NodeUncordon, "uncordon", "node", "NODES",
     "the health monitor: the node passed its validation and takes new work again"),
    ("node.validation", "node.{node}.validation", {}, c.NodeValidation, "validation", "node", "NODES",
     "the node agent: the result of the active check the health monitor asked for"),
    ("node.repair", "node.{node}.repair", {}, c.NodeRepair, "repair", "node", "NODES",
     "the node agent (`gpu-reset`, `node-reboot`) or the health monitor (`replace-node`, once the node's "
     "repair budget is spent): one repair step and its outcome"),
]

PARAMETERS = {
    "workspace": "the workspace, one subject token ([A-Za-z0-9_-]); `default` when the config names none",
    "run_id": "`<name>-<16 hex>` where the hex is the first 16 digits of sha256(submission_id); lower-case "
              "letters, digits and dashes",
    "cluster": "the backend's cluster name (`local` on the embedded stack)",
    "node": "the machine's node name",
}

PUBLISHED_BY_CLIENT = "a person's client (tau CLI, taugrid.client, or any client that follows this document)"


def _ref(name: str, *, asyncapi: bool) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}" if asyncapi else f"#/$defs/{name}"}


def _payload_types() -> list[type[msgspec.Struct]]:
    """Every payload type, each once, in catalogue order."""
    seen: list[type[msgspec.Struct]] = []
    for kind in [*RUN_EVENTS.values(), *(ch[3] for ch in OTHER_CHANNELS)]:
        if kind not in seen:
            seen.append(kind)
    return seen


def _components(*, asyncapi: bool) -> dict[str, Any]:
    template = "#/components/schemas/{name}" if asyncapi else "#/$defs/{name}"
    _, components = msgspec.json.schema_components(_payload_types(), ref_template=template)
    return dict(sorted(components.items()))


def json_schema() -> dict[str, Any]:
    """One JSON Schema document: ``$defs`` holds every payload; ``x-taugrid-events`` maps each CloudEvents
    type (``ce-type``) to the payload its body carries."""
    events = {ce_type(kind): _ref(struct.__name__, asyncapi=False) for kind, struct in RUN_EVENTS.items()}
    for _, _, _, struct, kind, family, _, _ in OTHER_CHANNELS:
        events[ce_type(kind, family=family)] = _ref(struct.__name__, asyncapi=False)
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": "https://taugrid.io/schemas/events.schema.json",
        "title": "taugrid event payloads",
        "description": (
            "The JSON body of every CloudEvent on the taugrid bus (binary mode: the attributes are NATS "
            "headers, see docs/asyncapi.yaml). Generated from taugrid.core.contracts by `tau events schema "
            "--format jsonschema`; do not edit. Readers must ignore unknown fields: fields are only ever "
            "added, with defaults."
        ),
        "x-taugrid-events": events,
        "$defs": _components(asyncapi=False),
    }


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _header_schemas() -> dict[str, Any]:
    common = {
        "ce-specversion": _string("CloudEvents version", const=SPEC_VERSION),
        "ce-id": _string("event id, unique per event. A run event's is "
                         "`<run_id>.<attempt>.<stage>.<outcome>[.<suffix>]` (a cancel adds a random suffix so "
                         "each request is its own event); a service's event leaves it out where a reader derives "
                         "it from Nats-Msg-Id (see CloudEventHeaders), and keeps it on an event re-stored under "
                         "another message id"),
        "ce-type": _string(f"`{CE_PREFIX}<family>.<stage>.<outcome>.v<version>`, e.g. "
                           f"`{ce_type('submit.requested')}`; the version lives here, never in the subject",
                           pattern=r"^io\.taugrid\.[a-z]+\.[a-z_.]+\.v[0-9]+$"),
        "ce-source": _string("who published it: `/svc/<service>` (services), `/svc/client` (the tau CLI), "
                             "`/svc/portal` (the web portal, for a person: see Delegation); a service's event "
                             "is trusted only from the service the catalogue names"),
        "ce-subject": _string("the run id for run events (the node or run for others)"),
        "ce-time": _string("RFC 3339 UTC time with milliseconds, e.g. 2026-11-30T12:00:00.123Z; a service's run "
                           "event published when it happened leaves it out (its time is when the stream it is "
                           "read from stored it: RUNS, or HISTORY or AUDIT, whose copy follows RUNS' while their "
                           "feeds keep up, about a millisecond later)"),
        "ce-workspace": _string("the run's workspace (taugrid extension)"),
        "ce-attempt": _string("the run's attempt, from 1, as decimal text (taugrid extension)",
                              pattern="^[1-9][0-9]*$"),
        "content-type": _string("the body's media type, always application/json (the document's "
                                "defaultContentType); left out by taugrid's publishers (issue 27: 32 bytes on "
                                "every stored message), accepted from a client that sends it",
                                const="application/json"),
        "Nats-Msg-Id": _string("deterministic, so JetStream drops a repeat within the stream's duplicate window: "
                               f"ce-id itself, or its key (issue 27): the first {DEDUP_KEY_CHARS} characters of the "
                               "base64url sha256 of ce-id (taugrid's client sends it on a request, which keeps its "
                               "ce-id), then on a service's run event `:<suffix>` when the id has a suffix. Absent "
                               "on the local cluster's watch changes (k8s.local.…), whose ids do not repeat (each "
                               "is its object's next resourceVersion)"),
        "traceparent": _string("W3C trace context (optional). A run event or log chunk without one is in its "
                               "run's derived trace (issue 27): `00-<t>-<s>-01`, t the first 32 and s the next 16 "
                               "hex digits of sha256 of the run id (the subject's `<run>` token); taugrid's "
                               "publishers leave that value out, a client may too, and keep any other"),
    }
    required = ["ce-specversion", "ce-id", "ce-type", "ce-source", "ce-subject", "ce-time"]
    service = {
        **common,
        USER_HEADER: _string("the run's verified submitter (the user name whose signature the submitter "
                             "checked), on every event a service publishes after submit.accepted"),
        SIGNATURE_HEADER: _string("the publishing service's ed25519 signature (scheme tau-svc-v1: the request "
                                  "form's lines, then ce-source, ce-workspace, ce-attempt and ce-tauuser, each "
                                  "header left out counted at its derived value) by the key the bootstrap "
                                  "recorded for the service ce-source names (KV service_keys); absent on a bus "
                                  "without authentication and on log chunks", pattern="^[A-Za-z0-9_-]{86}$"),
        SIGNER_HEADER: _string("left out by taugrid's services: the signing key is the one recorded for the "
                               "service ce-source names; one that is present must be that key",
                               pattern="^U[A-Z2-7]{55}$"),
    }
    signed = {
        **common,
        SIGNER_HEADER: _string("the author's NATS user public nkey (`U…`, 56 characters)",
                               pattern="^U[A-Z2-7]{55}$"),
        SIGNATURE_HEADER: _string(f"ed25519 signature by {SIGNER_HEADER} over the canonical form (see "
                                  "SignedRequest), 64 bytes as base64url without padding (86 characters)",
                                  pattern="^[A-Za-z0-9_-]{86}$"),
        DELEGATION_HEADER: _string(f"optional: a person's delegation token, when a service (the web portal) "
                                   f"signs the request for them with its own key in {SIGNER_HEADER}; the "
                                   "request then counts as that person's (see Delegation)",
                                   pattern=r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{86}$"),
    }
    return {
        "CloudEventHeaders": {
            "type": "object",
            "description": "headers of an event a service publishes, stored compact (issue 27): a header whose "
                           "value a reader derives is left out when it has exactly that value, and a reader "
                           "takes the derived one: ce-specversion `1.0`; ce-id the Nats-Msg-Id, or from a key "
                           "`<key>[:<suffix>]` on a run event `<run>.<attempt>.<stage>.<outcome>` (the subject's, "
                           "ce-attempt's) then `.<suffix>`; ce-attempt `1`; ce-time (a run event's) the time the "
                           "stream stored it; traceparent (a run event's, a log chunk's) the run's derived one; "
                           "on a run event (`run.<ws>.<run>.<stage>.<outcome>[.high]`) ce-type "
                           "`io.taugrid.run.<stage>.<outcome>.v1`, ce-subject `<run>` and ce-workspace `<ws>`; "
                           "on a log chunk (`log.<ws>.<run>.<attempt>`) ce-subject and ce-workspace the same "
                           "way; on a watch change (`k8s.<cluster>.<kind>.<ns>.<name>.<change>[.high]`) ce-type "
                           "`io.taugrid.k8s.<kind>.<change>.v1`. A header that is present is read as it is, and "
                           "one that contradicts the subject gets the message refused",
            "properties": service, "required": ["ce-source"],
        },
        "SignedRequestHeaders": {
            "type": "object",
            "description": "headers of a request a person publishes (submit.requested, cancel.requested): "
                           "the CloudEvents headers plus the signature; a client's ce-tauuser is ignored",
            "properties": signed,
            "required": [*required, "Nats-Msg-Id", "ce-workspace", "ce-attempt", SIGNER_HEADER, SIGNATURE_HEADER],
        },
        "DeadLetterHeaders": {
            "type": "object",
            "description": "headers of a dead letter: the original message's headers (its Nats-Msg-Id "
                           "replaced) plus why and where from",
            "properties": {
                "Nats-Msg-Id": _string("`dlq.<stream>.<consumer>.<stream sequence>`: one dead letter per "
                                       "message and consumer"),
                "x-dlq-consumer": _string("the durable consumer that gave up on the message"),
                "x-dlq-subject": _string("the original message's subject"),
                "x-dlq-stream-seq": _string("the original message's sequence in its stream, as decimal text",
                                            pattern="^[0-9]+$"),
                "x-dlq-error": _string("why the consumer refused it (at most 2000 characters)"),
            },
            "required": ["Nats-Msg-Id", "x-dlq-consumer", "x-dlq-subject", "x-dlq-stream-seq", "x-dlq-error"],
        },
    }


SIGNING = f"""\
A person's requests (`submit.requested`, `cancel.requested`) are signed with their NATS user nkey (ed25519).
The submitter refuses an unsigned or badly signed submission (`submit.rejected`, field `{SIGNATURE_HEADER}`)
and the renderer answers a cancel with `cancel.accepted` / `cancel.refused`.

1. Build the body: the JSON of the payload (`SubmitRequested` / `CancelRequested`), UTF-8.
2. Set the CloudEvents headers (SignedRequestHeaders).
3. The canonical form is these seven lines joined by `\\n`, no trailing newline, encoded as UTF-8:

       {SIGNATURE_SCHEME}
       <the NATS subject published to, e.g. run.default.quickstart-3f2a1b.submit.requested>
       <ce-id>
       <ce-type>
       <ce-subject>
       <ce-time>
       <sha256 of the body, 64 lower-case hex digits>

4. `{SIGNER_HEADER}` = the public key (`U…`); `{SIGNATURE_HEADER}` = base64url without padding (RFC 4648 §5)
   of the 64-byte ed25519 signature of the canonical form by the user's seed (`SU…`).
5. Publish at once: a request stored more than {SIGNATURE_MAX_AGE_S:.0f} s from its `ce-time` (either way) is
   refused with field `ce-time` (a replayed old request, or a wrong clock).

Who may sign: on a platform that lists users, a key listed in `platform.yaml` users; on the embedded stack
(no users listed), the local user `tau up` created, whose seed is `$TAU_DATA_DIR/creds/user.nk` (default
`~/.tau`; a text file holding one `SU…` seed). The verified user is then named in `ce-{USER_HEADER[3:]}` and
in `SubmitAccepted.user` on every later event of the run; the body's own `user` field is only a claim.
"""

DELEGATING = f"""\
A service may act for a person only with that person's signed, expiring permission: the web portal's session.
The token is `<base64url(body)>.<base64url(signature)>` (no padding). The body is the JSON
`{{"user": <the person's public nkey U…>, "delegate": <the service's public nkey U…>, "issued": <epoch s>,
"expires": <epoch s>}}`; the signature is the person's ed25519 signature over the UTF-8 bytes
`{delegation.SCHEME}\\n` followed by the body (at most {delegation.MAX_TTL_S / 86400:.0f} days between issued and
expires). `tau portal` issues one naming the portal's key.

The portal sends a person's `cancel.requested` signed with its own key (`{SIGNER_HEADER}` is the portal's) and the
token in the `{DELEGATION_HEADER}` header. The renderer then checks the signature as usual, and the token in full:
well formed, signed by its `user`, `delegate` equal to the request's signer, not expired when the request was
stored, issued at most {delegation.CLOCK_SKEW_S:.0f} s in the future. If all hold, the request is that `user`'s
and the same authorization applies as to `tau cancel`; if not, `cancel.refused` names field
`{DELEGATION_HEADER}`. Only a service the platform allows to publish the subject (`/svc/portal` for
`run.*.*.cancel.requested`) sends it.
"""

SUBMITTING = f"""\
How to submit and follow a run (what tests/contract/node/submit.mjs does, from this document alone):

1. Choose a `submission_id` (any unique string of subject-safe characters). The run id is
   `<dns-label of the config's name, at most 40 characters>-<first 16 hex digits of sha256(submission_id)>`.
2. The code: a tar.gz of the project directory (regular files with paths relative to the project root) put
   into the JetStream object store `{UPLOADS_STORE}` under the name `sources/<sha256 hex of the tar.gz>.tar.gz`
   (skip the put when the store `{SOURCES_STORE}` already has that name). The submitter hashes the upload and
   copies it into `{SOURCES_STORE}`, which only it writes, refusing a submission whose object does not hash to
   that digest; `source_object` is that name and `source_digest` is `sha256:<hex>`. A config
   whose entrypoint needs no project files (`command:`) may leave both empty.
3. Publish `SubmitRequested` (signed) to `run.<workspace>.<run_id>.submit.requested` with ce-id
   `<run_id>.1.submit.requested`, ce-subject `<run_id>`, ce-attempt `1`, and wait for the JetStream ack.
   A run of a priority class that the platform ranks above the workspace's default may go on
   `run.<workspace>.<run_id>.submit.requested.{HIGH_LANE}` instead (the high lane: the stages before admission
   read it with durables of their own, so it is not queued behind a backlog of other runs); the submitter and
   the policy decide the lane again from the platform, and `submit.accepted` and `policy.approved` of a run
   they keep in the high lane carry the same `.{HIGH_LANE}` suffix.
4. Follow with a JetStream consumer (ordered, deliver all) on stream RUNS filtered to
   `run.<workspace>.<run_id>.>`, made before the publish of step 3: RUNS keeps an event only until the stages
   have read it (interest retention). Events arrive in order; `{', '.join(sorted(TERMINAL_EVENTS))}` end the
   run's lifecycle, and `evidence.sealed` comes last. A success reads: submit.requested, submit.accepted,
   policy.approved, render.applied, admission.queued (optional), admission.admitted, exec.preparing
   (optional, repeated), exec.running, exec.succeeded, evidence.sealed.
   Later, read them from streams {HISTORY_STREAM} and {AUDIT_STREAM}: {AUDIT_STREAM} keeps the kinds verification
   needs (the request, a cancellation, the end, `evidence.sealed`) under `{AUDIT_PREFIX}.<workspace>.<run_id>`,
   {HISTORY_STREAM} every other kind under `{HISTORY_PREFIX}.<workspace>.<run_id>`, body and headers as RUNS stored
   them: each message's
   `Nats-Stream-Source` header (written by nats-server, which refuses a publish that carries one:
   `RUNS:C=<consumer> <RUNS sequence> <filter> <destination> <RUNS subject> <id>`) names the subject and
   sequence it was stored under in RUNS, hence its type. Merge the two and order them by that sequence: each
   stream's feeds copy at their own pace (the high lane's events come through a feed of their own).

Authentication: connect as the same user nkey (NATS nkey authentication: the client signs the server's
nonce with the seed; every NATS client library offers it), or with a `.creds` file the platform gave you
(`TAU_NATS_CREDS`). A server that requires no authentication (the embedded stack today) accepts either;
the request's signature is what identifies the person to taugrid.
"""


def _message(name: str, *, kind: str, family: str, payload: str, signed: bool, summary: str) -> dict[str, Any]:
    return {
        "name": name,
        "title": ce_type(kind, family=family),
        "summary": summary,
        "contentType": "application/json",
        "headers": {"$ref": "#/components/schemas/"
                            + ("SignedRequestHeaders" if signed else "CloudEventHeaders")},
        "payload": _ref(payload, asyncapi=True),
    }


def _run_stream(kind: str) -> str:
    """Where a run event is stored: RUNS (until the stages have read it), kept in AUDIT when verification needs it
    (``AUDIT_KEPT_EVENTS``), else in HISTORY."""
    kept = AUDIT_STREAM if kind in AUDIT_KEPT_EVENTS else HISTORY_STREAM
    return f"stream RUNS (kept in {kept})"


def _run_summary(kind: str) -> str:
    struct = RUN_EVENTS[kind]
    doc = (struct.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    base = f"`{kind}` ({struct.__name__})"
    if kind in SIGNED_TYPES:
        base += ", published by " + PUBLISHED_BY_CLIENT + ", signed"
    if kind in TERMINAL_EVENTS:
        base += "; terminal: the run's state never changes after it"
    return f"{base}. {doc}" if doc and not doc.startswith("Base") else base


def asyncapi() -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the bus (a plain dict, ready for JSON or YAML)."""
    stream_of = {s.subjects[0].split(".")[0]: s for s in STREAMS}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    run_params = {p: {"description": PARAMETERS[p]} for p in ("workspace", "run_id")}
    for kind in RUN_EVENTS:
        stage, outcome = kind.split(".")
        msg_id = f"run.{kind}"
        signed = kind in SIGNED_TYPES
        messages[msg_id] = _message(msg_id, kind=kind, family="run", payload=RUN_EVENTS[kind].__name__,
                                    signed=signed, summary=_run_summary(kind))
        channels[msg_id] = {
            "address": f"run.{{workspace}}.{{run_id}}.{stage}.{outcome}",
            "description": _run_stream(kind),
            "parameters": run_params,
            "messages": {msg_id: {"$ref": f"#/components/messages/{msg_id}"}},
        }
        operations[("submit" if kind == "submit.requested" else "cancel" if kind == "cancel.requested"
                    else "on." + kind)] = {
            "action": "send" if signed else "receive",
            "channel": {"$ref": f"#/channels/{msg_id}"},
            "summary": ("publish a signed request (see info.description: Signing)" if signed
                        else f"follow `{kind}` with a JetStream consumer on stream RUNS"),
            "messages": [{"$ref": f"#/channels/{msg_id}/messages/{msg_id}"}],
        }
    for kind in sorted(LANED_EVENTS):  # the high priority lane: the same messages on a sixth token
        stage, outcome = kind.split(".")
        msg_id, chan_id = f"run.{kind}", f"run.{kind}.{HIGH_LANE}"
        channels[chan_id] = {
            "address": f"run.{{workspace}}.{{run_id}}.{stage}.{outcome}.{HIGH_LANE}",
            "description": f"{_run_stream(kind)}; `{kind}` of a run in the high priority "
                           "lane, read by the stage's high-lane durable before the default lane's backlog",
            "parameters": run_params,
            "messages": {msg_id: {"$ref": f"#/components/messages/{msg_id}"}},
        }
        operations[("submit." + HIGH_LANE if kind == "submit.requested" else f"on.{kind}.{HIGH_LANE}")] = {
            "action": "send" if kind in SIGNED_TYPES else "receive",
            "channel": {"$ref": f"#/channels/{chan_id}"},
            "summary": ("publish a signed request in the high lane (see info.description: Signing)"
                        if kind in SIGNED_TYPES else f"follow `{kind}` of high-lane runs on stream RUNS"),
            "messages": [{"$ref": f"#/channels/{chan_id}/messages/{msg_id}"}],
        }
    for chan_id, address, params, struct, kind, family, stream, who in OTHER_CHANNELS:
        messages[chan_id] = _message(chan_id, kind=kind, family=family, payload=struct.__name__, signed=False,
                                     summary=f"{struct.__name__}, published by {who}")
        names = [p.strip("{}") for p in address.split(".") if p.startswith("{")]
        channels[chan_id] = {
            "address": address,
            "description": f"stream {stream}",
            "parameters": {p: {"description": params.get(p) or PARAMETERS[p]} for p in names},
            "messages": {chan_id: {"$ref": f"#/components/messages/{chan_id}"}},
        }
        operations["on." + chan_id] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{chan_id}"},
            "messages": [{"$ref": f"#/channels/{chan_id}/messages/{chan_id}"}],
        }
    messages["dlq"] = {
        "name": "dlq",
        "title": "dead letter",
        "summary": "a copy of a message a consumer refused or could not decode (a consumer of any service); "
                   "its body and CloudEvents headers are the original's, unchanged. `tau dlq` lists and "
                   "replays them. The stream also stores the server's max-deliveries advisories "
                   f"(`{ADVISORY_PREFIX}<stream>.<consumer>`, the server's JSON) for a message whose handler "
                   "kept failing",
        "headers": {"$ref": "#/components/schemas/DeadLetterHeaders"},
        "payload": {"description": "the original message's body, unchanged"},
    }
    channels["dlq"] = {
        "address": "dlq.{stream}.{consumer}",
        "description": f"stream {DLQ_STREAM}",
        "parameters": {"stream": {"description": "the stream the original message is in"},
                       "consumer": {"description": "the durable consumer that gave up on it"}},
        "messages": {"dlq": {"$ref": "#/components/messages/dlq"}},
    }
    operations["on.dlq"] = {
        "action": "receive",
        "channel": {"$ref": "#/channels/dlq"},
        "messages": [{"$ref": "#/channels/dlq/messages/dlq"}],
    }
    streams = {
        s.name: {"subjects": s.subjects, "max_age_s": s.max_age, "duplicate_window_s": s.duplicate_window,
                 "storage": "file", "retention": "interest" if s.interest else "limits"}
        for s in STREAMS
    }
    runs = next(s for s in STREAMS if s.name == "RUNS")
    # sourced from RUNS through its feeds (``topology.FEEDS``): one subject a run, each message's
    # ``Nats-Stream-Source`` header naming its RUNS subject and sequence
    streams[HISTORY_STREAM] = {"sources": "RUNS", "subjects": f"{HISTORY_PREFIX}.{{workspace}}.{{run_id}}",
                               "filters": [f for feed in FEEDS if feed.into == HISTORY_STREAM for f in feed.filters],
                               "deny_delete": True, "deny_purge": True, "storage": "file", "retention": "limits",
                               "max_age_s": runs.max_age}  # retention.runs, as RUNS' (config/retention.py)
    streams[AUDIT_STREAM] = {"sources": "RUNS", "subjects": f"{AUDIT_PREFIX}.{{workspace}}.{{run_id}}",
                             "filters": list(AUDIT_FILTERS), "deny_delete": True, "deny_purge": True,
                             "storage": "file", "retention": "limits", "max_age_s": AUDIT_MAX_AGE}
    assert set(stream_of) >= {"run", "log", "backend", "k8s", "node", "dlq"}  # every channel's stream exists
    schemas = {**_header_schemas(), **_components(asyncapi=True)}
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "taugrid bus",
            "version": __version__,
            "description": (
                "Every event on the taugrid bus is a CloudEvent 1.0 in NATS binary mode: the JSON payload is "
                "the message body, the attributes are `ce-*` headers. Every publish goes to a JetStream "
                "stream (wait for its ack). A service's event is stored compact: the headers its subject or "
                "its source say are left out (CloudEventHeaders says which and how to derive them), and a run "
                "event's body leaves out every field at its default (each payload schema names the defaults; "
                "a reader applies them). Generated by `tau events schema`; do not edit.\n\n"
                "## Signing\n\n" + SIGNING + "\n## Delegation\n\n" + DELEGATING
                + "\n## Submitting from any client\n\n" + SUBMITTING
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "127.0.0.1:4222",
                "protocol": "nats",
                "description": "the embedded stack (`tau up`; `tau stack` prints its URL)",
                "security": [{"$ref": "#/components/securitySchemes/userNkey"}],
            },
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "schemas": schemas,
            "messages": messages,
            "securitySchemes": {
                "userNkey": {
                    "type": "asymmetricEncryption",
                    "description": "NATS nkey (ed25519) user authentication (the client signs the server's "
                                   "nonce); the same user key signs requests (see Signing)",
                },
            },
        },
        "x-taugrid-streams": streams,
        "x-taugrid-object-store": {
            "bucket": SOURCES_STORE,
            "sources": "sources/<sha256 hex>.tar.gz: project snapshots a submission names in source_object "
                       "(content-addressed, written once by the submitter, verified on every fetch)",
            "uploads": f"bucket {UPLOADS_STORE}: people put snapshots here under the same name; the submitter "
                       f"verifies and promotes them into {SOURCES_STORE}; kept {UPLOADS_TTL_S // 3600} h",
            "evidence": f"bucket {OBJECT_STORE}: sealed bundles, written by the evidence service only",
        },
    }


def dump(document: dict[str, Any], output: str) -> str:
    """The text of a document as committed in docs/ (``yaml`` keeps key order; ``json`` is indented)."""
    if output == "yaml":
        return str(yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110))
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line text as YAML literal blocks, so the committed document reads like the prose it holds."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)
