"""The chart's bus configuration works on a real nats-server: the `nats.conf` that `helm template` renders
(TLS, the users include, the pid file), the users that `tau admin chart-credentials` + `chartauth render` produce
from the generated Secrets, and the auth-sync loop that follows the platform and reloads the server.

Paths of the pod (/data, /run/nats, /etc/nats-tls) are mapped into a temp dir; nothing else is changed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from taugrid import settings
from taugrid.bus import Bus, connect, creds
from taugrid.bus.bootstrap import bootstrap, record_local_admin
from taugrid.bus.platformstore import get_local_user, put_text
from taugrid.bus.topology import SOURCES_STORE
from taugrid.cli.main import cli
from taugrid.core.contracts import Rejected, ResolvedRun, SubmitRequested
from taugrid.core.errors import PermanentError, PermissionDenied
from taugrid.core.ids import new_run_id
from taugrid.evidence import anchor
from taugrid.ports import free_port
from taugrid.render.source import RenderSettings, fetch_container
from taugrid.stack import chartauth, natsserver
from taugrid_services.anchor.__main__ import exporter
from tests.platforms import lab_platform, workspace

from .test_chart import CHART, K8S_VERSION, one
from .tools import tool

PLATFORM = lab_platform(cohort=True, namespace="team-a", workspaces=[
    workspace("team-a", namespace="team-a", output_root="/data/runs", members="MEMBERS")])


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "the TLS test needs the openssl command line tool"
    subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certs(d: Path) -> None:
    """A private CA and a server certificate for localhost, as cert-manager would write into the TLS Secret."""
    d.mkdir(parents=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=taugrid-test-ca",
             "-days", "1", cwd=d)
    _openssl("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=localhost", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "tls.crt", "-days", "1", "-extfile", "san.ext", cwd=d)


@dataclass
class ChartBus:
    root: Path
    proc: subprocess.Popen[bytes]
    port: int
    secrets: dict[str, dict[str, Any]]  # namespace -> Secret
    syncer: chartauth.Syncer

    @property
    def url(self) -> str:
        """What the chart gives services (nats://<service>:4222): the server requires TLS, the client follows."""
        return f"nats://localhost:{self.port}"

    @property
    def ca(self) -> Path:
        return self.root / "etc" / "nats-tls" / "ca.crt"

    @property
    def tls_url(self) -> str:
        return f"tls://localhost:{self.port}"

    def seed_file(self, key: str, namespace: str = "taugrid") -> Path:
        """A Secret item as the pod sees it mounted."""
        path = self.root / "mounted" / namespace / key
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.secrets[namespace]["stringData"][key])
            path.chmod(0o600)
        return path

    async def service(self, name: str) -> Bus:
        return await connect(self.url, name=name, creds=self.seed_file(f"svc-{name}.nk"), ca=self.ca,
                             max_reconnect_attempts=0)

    async def wait_revision(self, revision: int, reloads: int) -> None:
        deadline = time.monotonic() + 15
        while self.syncer.revision < revision or self.syncer.reloads < reloads:
            assert time.monotonic() < deadline, (self.syncer.revision, self.syncer.reloads)
            await asyncio.sleep(0.05)


def rendered_nats_conf(root: Path, port: int, monitor: int) -> Path:
    args = [str(tool("helm")), "template", "t", str(CHART), "--namespace", "taugrid", "--kube-version", K8S_VERSION,
            "--set", "nats.embedded.tls.enabled=true", "--set", "nats.embedded.tls.secretName=bus-tls",
            "--set", "nats.embedded.external.enabled=true"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    text = one([d for d in yaml.safe_load_all(out) if d], "ConfigMap", "t-taugrid-nats")["data"]["nats.conf"]
    for pod_path, here in [("0.0.0.0:4222", f"127.0.0.1:{port}"), ("0.0.0.0:8222", f"127.0.0.1:{monitor}"),
                           ("store_dir: /data", f"store_dir: {root / 'data'}"), ('"/run/nats/', f'"{root}/run/nats/'),
                           ('"/etc/nats-tls/', f'"{root}/etc/nats-tls/')]:
        assert pod_path in text, pod_path
        text = text.replace(pod_path, here)
    conf = root / "etc" / "nats" / "nats.conf"  # its include "../../run/nats/auth.conf" lands in root/run/nats
    conf.parent.mkdir(parents=True)
    conf.write_text(text)
    return conf


@pytest.fixture(scope="module")
async def chart_bus(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ChartBus]:
    root = tmp_path_factory.mktemp("chart-bus")
    result = CliRunner().invoke(cli, ["admin", "chart-credentials", "--dir", str(root / "operator"), "--admin", "ops",
                                      "-n", "team-a", "--out", str(root / "secrets.yaml")])
    assert result.exit_code == 0, result.output
    secrets = {d["metadata"]["namespace"]: d for d in yaml.safe_load_all((root / "secrets.yaml").read_text()) if d}
    assert set(secrets) == {"taugrid", "team-a"}
    identities = root / "etc" / "taugrid" / "identities" / "identities.json"
    identities.parent.mkdir(parents=True)
    identities.write_text(secrets["taugrid"]["stringData"]["identities.json"])
    auth_conf = root / "run" / "nats" / "auth.conf"
    assert chartauth._main(["render", "--identities", str(identities), "--out", str(auth_conf)]) == 0  # auth-init
    make_certs(root / "etc" / "nats-tls")
    port, monitor = free_port(), free_port()
    conf = rendered_nats_conf(root, port, monitor)
    log = open(root / "nats.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([natsserver.binary(), "-c", str(conf)], stdout=log, stderr=log,
                            env={**os.environ, "POD_NAME": "t-taugrid-nats-0"})
    stop = asyncio.Event()
    syncer = chartauth.Syncer(chartauth.load_identities(identities), out=auth_conf,
                              pid_file=root / "run" / "nats" / "nats.pid",
                              watch=[root / "etc" / "nats-tls" / "tls.crt"])
    server = ChartBus(root, proc, port, secrets, syncer)
    try:
        natsserver.wait_port(port)
        boot = await connect(server.url, name="bootstrap", creds=server.seed_file("bootstrap.nk"), ca=server.ca)
        try:
            await bootstrap(boot)  # what the bootstrap Job runs, with TAU_LOCAL_ADMIN from the Secret
            assert await record_local_admin(boot, secrets["taugrid"]["stringData"]["local-admin"])
        finally:
            await boot.close()
        follow = asyncio.ensure_future(syncer.follow(server.url, tick=0.2, stop=stop, ca=server.ca,
                                                     creds=server.seed_file("svc-auth_sync.nk")))
        yield server
        stop.set()
        await asyncio.wait_for(follow, timeout=10)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


async def once_reloaded(attempt: Any, *, refused: bool) -> Bus | None:
    """The server applies a SIGHUP asynchronously (tens of ms): retry until the new users are in force."""
    deadline = time.monotonic() + 10
    while True:
        try:
            bus: Bus = await attempt()
        except PermissionDenied:
            if refused:
                return None
        else:
            if not refused:
                return bus
            await bus.close()
        assert time.monotonic() < deadline, "the reloaded users never took effect"
        await asyncio.sleep(0.1)


async def admin(server: ChartBus) -> Bus:
    """The operator, with the seed `tau admin chart-credentials` kept in --dir (never in the cluster)."""
    return await connect(server.tls_url, name="ops", creds=server.root / "operator" / "admin.nk",
                         ca=server.ca, max_reconnect_attempts=0)


async def test_the_bootstrap_job_records_the_operator_as_the_local_admin(chart_bus: ChartBus) -> None:
    ops = await admin(chart_bus)
    try:
        local = await get_local_user(ops)
    finally:
        await ops.close()
    assert local is not None and local.name == "ops"
    assert local.nkey == chartauth.load_identities(
        chart_bus.root / "etc" / "taugrid" / "identities" / "identities.json").admin.public_key


async def test_a_service_credential_does_its_stages_work_and_no_other(chart_bus: ChartBus) -> None:
    run = new_run_id("svc", "s1")
    policy = await chart_bus.service("policy")
    try:
        seq = await policy.emit(workspace="team-a", run_id=run, attempt=1, event_type="policy.approved",
                                payload=Rejected(reasons=[], message="ok"), user="ops")
        assert seq > 0
        with pytest.raises(PermissionDenied, match="recovery.retrying"):
            await policy.emit(workspace="team-a", run_id=run, attempt=2, event_type="recovery.retrying",
                              payload=Rejected(reasons=[], message="no"), user="ops")
    finally:
        await policy.close()


async def test_people_follow_the_platform_without_a_restart_and_cannot_forge_a_decision(chart_bus: ChartBus,
                                                                                         tmp_path: Path) -> None:
    from taugrid.bus import creds

    alice = creds.new_identity("alice")
    alice_file = creds.write(tmp_path / "alice.nk", alice)
    ca = chart_bus.root / "etc" / "nats-tls" / "ca.crt"
    with pytest.raises(PermissionDenied):  # not a user yet
        await connect(chart_bus.tls_url, name="alice", creds=alice_file, ca=ca, max_reconnect_attempts=0)
    ops = await admin(chart_bus)
    try:
        text = PLATFORM.replace("MEMBERS", "[alice]") + f"users:\n  - {{name: alice, nkey: {alice.public_key}}}\n"
        revision = await put_text(ops, text)
    finally:
        await ops.close()
    pid = chart_bus.proc.pid
    await chart_bus.wait_revision(revision, reloads=1)

    def as_alice() -> Any:
        return connect(chart_bus.tls_url, name="alice", creds=alice_file, ca=ca, max_reconnect_attempts=0)

    bus = await once_reloaded(as_alice, refused=False)
    assert bus is not None
    try:
        run = new_run_id("mine", "m1")
        assert await bus.emit(workspace="team-a", run_id=run, attempt=1, event_type="submit.requested",
                              payload=SubmitRequested(submission_id="s", config_text="name: x\n",
                                                      config_path="tau.yaml", workspace="team-a"), user="alice") > 0
        with pytest.raises(PermissionDenied, match="policy.approved"):
            await bus.emit(workspace="team-a", run_id=run, attempt=1, event_type="policy.approved",
                           payload=Rejected(reasons=[], message="forged"), user="alice")
    finally:
        await bus.close()
    assert chart_bus.proc.pid == pid and chart_bus.proc.poll() is None  # reloaded, never restarted
    ops = await admin(chart_bus)
    try:
        revision = await put_text(ops, PLATFORM.replace("MEMBERS", "[]"))  # alice removed
    finally:
        await ops.close()
    await chart_bus.wait_revision(revision, reloads=2)
    assert await once_reloaded(as_alice, refused=True) is None


async def test_every_connection_is_tls_verified_against_the_ca(chart_bus: ChartBus) -> None:
    ops = chart_bus.root / "operator" / "admin.nk"
    with pytest.raises(PermanentError, match="cannot verify the TLS certificate .* --ca"):  # a private CA
        await connect(chart_bus.tls_url, name="ops", creds=ops, max_reconnect_attempts=0)
    with pytest.raises(PermanentError, match="TAU_NATS_CA"):  # nor does a plain nats:// URL get around TLS
        await connect(chart_bus.url, name="ops", creds=ops, max_reconnect_attempts=0)
    bus = await connect(chart_bus.url, name="ops", creds=ops, ca=chart_bus.ca, max_reconnect_attempts=0)
    try:
        assert bus.nc.connected_url is not None
        assert bus.nc._transport is not None  # noqa: SLF001 - the transport is the TLS one
        assert bus.nc._transport._io_writer.get_extra_info("ssl_object") is not None  # noqa: SLF001
    finally:
        await bus.close()


async def test_the_source_fetch_credential_reads_objects_and_nothing_else(
        chart_bus: ChartBus, monkeypatch: pytest.MonkeyPatch) -> None:
    submitter = await chart_bus.service("submitter")  # the only writer of `sources` (people put into `uploads`)
    try:
        await submitter.guarded((await submitter.objects(SOURCES_STORE)).put("sources/abc.tar.gz", b"snapshot"))
    finally:
        await submitter.close()
    # The init container as the renderer writes it: TAU_NATS_CA_PEM from the CA the chart mounts into the
    # renderer (TAU_SOURCE_FETCH_NATS_CA), the seed from the Secret in the workspace namespace.
    settings = RenderSettings.from_env({"TAU_SOURCE_FETCH_NATS_CA": str(chart_bus.ca)})
    container = fetch_container(ResolvedRun(run_id="r", submission_id="s", workspace="team-a", namespace="team-a",
                                                name="r", source_digest="sha256:abc"), settings)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TAU_NATS_CA_PEM"] == chart_bus.ca.read_text()
    monkeypatch.setenv("TAU_NATS_CA_PEM", env["TAU_NATS_CA_PEM"])
    fetch_creds = chart_bus.seed_file("creds", namespace="team-a")  # the Secret in the workspace namespace
    fetch = await connect(chart_bus.url, name="source-fetch", creds=fetch_creds, max_reconnect_attempts=0)
    try:
        got = await (await fetch.objects(SOURCES_STORE)).get("sources/abc.tar.gz")
        assert got.data == b"snapshot"
        with pytest.raises(PermissionDenied):  # bundles and logs are not the fetch's business
            await fetch.guarded((await fetch.objects()).get("bundles/x"))
        with pytest.raises(PermissionDenied, match="submit.requested"):
            await fetch.emit(workspace="team-a", run_id=new_run_id("x", "x1"), attempt=1,
                             event_type="submit.requested", payload=Rejected(reasons=[], message="no"), user="x")
        with pytest.raises(PermissionDenied):
            await fetch.guarded((await fetch.kv("platform")).get("current"))
    finally:
        await fetch.close()


async def test_a_renewed_certificate_reloads_the_server(chart_bus: ChartBus) -> None:
    before = chart_bus.syncer.reloads
    cert = chart_bus.root / "etc" / "nats-tls" / "tls.crt"
    with contextlib.suppress(FileNotFoundError):
        cert.write_bytes(cert.read_bytes())  # same content: nothing to do
    await asyncio.sleep(0.5)
    assert chart_bus.syncer.reloads == before
    cert.write_bytes(cert.read_bytes() + b"\n")  # cert-manager swaps the files in place on renewal
    deadline = time.monotonic() + 10
    while chart_bus.syncer.reloads == before:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    # still serving TLS with the (renewed) files; a connection made while the server applies the reload may be
    # refused once (nats-server swaps its authorization with the config), so it is tried again for a few seconds
    deadline = time.monotonic() + 5
    while True:
        try:
            ops = await admin(chart_bus)
            break
        except PermissionDenied:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    await ops.close()


def test_the_operators_and_break_glass_seeds_never_enter_the_cluster(chart_bus: ChartBus) -> None:
    operator = chart_bus.root / "operator"
    seeds = [(operator / f).read_text().split()[-1] for f in ("admin.nk", "breakglass.nk")]
    assert all(seed.startswith("SU") for seed in seeds)
    for secret in chart_bus.secrets.values():
        assert not any(seed in value for value in secret["stringData"].values() for seed in seeds)
    conf = (chart_bus.root / "run" / "nats" / "auth.conf").read_text()
    assert "# break-glass admin" in conf and "# platform-admin ops" in conf  # admitted by public key only


async def test_the_anchor_service_signs_with_its_seed_and_may_only_read(
        chart_bus: ChartBus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = chart_bus.seed_file(chartauth.ANCHOR_SIGNING_FILE)  # as the anchor pod mounts it
    path = tmp_path / "anchors" / "ledger.jsonl"
    monkeypatch.setenv("TAU_ANCHOR_FILE", str(path))
    monkeypatch.setenv("TAU_ANCHOR_KEY", str(key))
    bus = await chart_bus.service("anchor")
    try:
        anchoring = exporter(settings.current().anchor)
        signed, drift = await anchoring.export(bus)
        assert signed is not None and drift == []
        assert anchor.signature_problems(signed, trusted=creds.load(key).public_key) == []
        assert anchor.read(path) == [signed]
        assert await anchoring.export(bus) == (None, [])  # nothing changed: no new line
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        with pytest.raises(PermissionDenied):
            await bus.guarded((await bus.kv("ledger")).put("run.ws.r", b"{}"))
        with pytest.raises(PermissionDenied, match="submit.requested"):
            await bus.emit(workspace="team-a", run_id=new_run_id("x", "x2"), attempt=1,
                           event_type="submit.requested", payload=Rejected(reasons=[], message="no"), user="x")
    finally:
        await bus.close()
