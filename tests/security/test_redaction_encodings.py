"""Secret redaction against a run that tries to carry a secret out (issue 22, item 6).

eve's run printed a secret's base64 and its reverse, and both were stored in LOGS and the evidence bundle; a
literal env ``MY_CFG`` holding a secret's value (a name the credential-name check lets through) was stored ten times
in the bundle. Here the same run is made (real processes under the local kubelet; a real nats-server and the
evidence service's own seal) and every common encoding of the value, under any name, comes out as
``[REDACTED]``, while the run still gets the value and its evidence still verifies."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from taugrid.bus import Bus
from taugrid.core.redaction import CORE_MIN, forms
from taugrid.evidence.verify import verify_run
from taugrid.local.kubelet import Kubelet
from taugrid.local.secrets import SecretStore, redactor, write_secret
from taugrid.local.shim import MAX_LINE, _pump
from tests.security.sealing import finish_and_seal, new_run, publish_run

SECRET = "hf_Tok3n/with+odd?chars&more=1!"
ENCODINGS: dict[str, Callable[[str], str]] = {
    "literal": lambda v: v,
    "reversed": lambda v: v[::-1],
    "hex": lambda v: v.encode().hex(),
    "HEX": lambda v: v.encode().hex().upper(),
    "base64": lambda v: base64.b64encode(v.encode()).decode(),
    "base64 unpadded": lambda v: base64.b64encode(v.encode()).decode().rstrip("="),
    "urlsafe base64": lambda v: base64.urlsafe_b64encode(v.encode()).decode(),
    "urlsafe base64 unpadded": lambda v: base64.urlsafe_b64encode(v.encode()).decode().rstrip("="),
    "url-encoded": lambda v: urllib.parse.quote(v, safe=""),
    "url-encoded, / kept": urllib.parse.quote,
    "url-encoded, + for space": lambda v: urllib.parse.quote_plus(v),
    "url-encoded, lower-case escapes": lambda v: re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(),
                                                       urllib.parse.quote(v, safe="")),
    "encodeURIComponent": lambda v: urllib.parse.quote(v, safe="!'()*"),
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_each_common_encoding_of_a_secret_is_blanked_from_a_log_line(encoding: str) -> None:
    form = ENCODINGS[encoding](SECRET)
    assert form.encode() in forms(SECRET)
    assert redactor([SECRET])(f"leak: {form} end".encode()) == b"leak: [REDACTED] end"


@pytest.mark.parametrize("prefix", ["", "a", "ab", "token=", "Authorization: Basic eve:"])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_a_secret_base64_encoded_inside_a_longer_string_is_blanked_at_every_alignment(
        prefix: str, encode: Callable[[bytes], bytes]) -> None:
    before, after = prefix.encode(), b":tail"
    encoded = encode(before + SECRET.encode() + after)
    # character i of base64 carries bits 6i..6i+5: the ones wholly inside the value go, its neighbours' stay
    first, end = -(-8 * len(before) // 6), 8 * (len(before) + len(SECRET)) // 6
    assert redactor([SECRET])(b"x " + encoded) == b"x " + encoded[:first] + b"[REDACTED]" + encoded[end:]


def test_short_values_and_short_base64_fragments_are_not_searched_for() -> None:
    assert forms("abc") == set()  # under REDACT_MIN: it would blank ordinary words
    assert all(len(f) >= 4 for f in forms("abcd"))
    assert min(len(f) for f in forms("abcdefghij") if f not in {b"abcdefghij", b"jihgfedcba"}) >= CORE_MIN
    assert redactor(["abcd"])(b"an abcd line, YWJj, dcba, 61626364") == b"an [REDACTED] line, YWJj, [REDACTED], " \
                                                                       b"[REDACTED]"


def test_an_encoded_secret_cut_across_two_partial_records_of_one_long_line_is_still_redacted() -> None:
    form = base64.b64encode(SECRET.encode())
    line = b"a" * (MAX_LINE - 20) + form + b" tail\n"  # the cut falls inside the encoded value
    out = io.BytesIO()
    _pump(io.BytesIO(line), out, redactor([SECRET]))
    texts = [r.split(b" ", 3)[3] for r in out.getvalue().splitlines()]
    assert b"".join(texts) == b"a" * (MAX_LINE - 20) + b"[REDACTED] tail"


LEAK = """import base64, hashlib, os, sys, urllib.parse
v = os.environ["MY_CFG"]
print(v)
print(base64.b64encode(v.encode()).decode())
print(base64.b64encode(("user:" + v).encode()).decode())
print(v[::-1])
print(v.encode().hex())
print(urllib.parse.quote(v, safe=""))
print("still has it:", hashlib.sha256(v.encode()).hexdigest() == sys.argv[1])
"""


async def test_a_pod_printing_a_workspace_secret_held_under_an_innocent_name_logs_only_redactions(
        tmp_path: Path) -> None:
    write_secret(tmp_path / "secrets", "sec-a", "api", {"token": SECRET})
    kubelet = Kubelet(tmp_path / "pods", resolve_secret=SecretStore(tmp_path / "secrets").resolver(),
                      secret_scope=lambda pod: "sec-a", claims_dir=tmp_path / "claims", poll_s=0.05)
    # no secretKeyRef: the value is a literal env var with a name of the run's choosing
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    main = {"name": "main", "image": "ignored", "command": [sys.executable, "-c", LEAK, digest],
            "env": [{"name": "MY_CFG", "value": SECRET}]}
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "leak", "namespace": "sec-a", "uid": "u1"},
                "spec": {"restartPolicy": "Never", "containers": [main]}}
    handle = await kubelet.start(manifest, lambda status: None)
    final = await handle.wait()
    assert final["phase"] == "Succeeded"
    lines = [ln.text for ln in kubelet.read_log("leak", "main", final=True)[0]]
    # the base64 of "user:<value>" keeps "dXNlcjp": "user:" and two bits of the value in its last character
    assert lines == ["[REDACTED]", "[REDACTED]", "dXNlcjp[REDACTED]", "[REDACTED]", "[REDACTED]", "[REDACTED]",
                     "still has it: True"]
    # what the shim runs from holds a placeholder for the literal too (pod.json is the manifest as it was given)
    spec = (kubelet.pods.dir("leak") / "spec.json").read_bytes()
    assert [f for f in forms(SECRET) if f in spec] == []


async def test_a_bundle_holds_no_form_of_a_workspace_secret_whatever_name_carried_it(
        bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws, run = new_run()
    monkeypatch.setenv("TAU_SECRETS_DIR", str(tmp_path / "secrets"))
    write_secret(tmp_path / "secrets", ws, "api", {"token": SECRET})
    text = f'name: train\nentrypoint: train.py\nruntime:\n  env:\n    MY_CFG: "{SECRET}"\n'
    printed = [f"{name}: {encode(SECRET)}" for name, encode in sorted(ENCODINGS.items())]
    await publish_run(bus, ws, run, tmp_path, config_text=text,
                      config={"name": "train", "runtime": {"env": {"MY_CFG": SECRET}}},
                      env={"MY_CFG": SECRET}, log_lines=printed)
    bundle = await finish_and_seal(bus, ws, run)

    stored = msgspec.json.encode(bundle)
    assert [f for f in sorted(forms(SECRET)) if f in stored or binascii.hexlify(f) in stored] == []
    assert bundle["config"]["text"] == 'name: train\nentrypoint: train.py\nruntime:\n  env:\n    MY_CFG: "[REDACTED]"\n'
    assert bundle["config"]["parsed"] == {"name": "train", "runtime": {"env": {"MY_CFG": "[REDACTED]"}}}
    assert bundle["resolved"]["env"] == {"MY_CFG": "[REDACTED]"}
    [requested] = [e for e in bundle["events"] if e["type"] == "submit.requested"]
    assert requested["data"]["config_text"] == bundle["config"]["text"]
    assert bundle["attempts"][0]["logs"]["text"] == "".join(f"{name}: [REDACTED]\n" for name in sorted(ENCODINGS))
    report = await verify_run(bus, run, workspace=ws)  # the hashes and signature it re-checks are untouched
    assert (report.ok, report.problems, report.user) == (True, [], "eve"), report.problems
