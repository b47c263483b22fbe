// A taugrid client in another language, written from docs/asyncapi.yaml alone ("Submitting from any client",
// "Signing", SignedRequestHeaders): it uploads a project snapshot, publishes a signed submit.requested
// CloudEvent and follows the run on run.<ws>.<run>.> until evidence.sealed, printing one JSON line per event.
//
//   node submit.mjs <project dir>      env: NATS_URL, TAU_DATA_DIR (its creds/user.nk signs and authenticates),
//                                      TAU_WORKSPACE, TAU_NATS_CREDS (a .creds file to authenticate with instead)
// Exit 0 when the run succeeded and was sealed, 1 when it ended otherwise, 2 on bad input.
//
// Only the `nats` package is used: the ed25519 signing comes from the nkeys it re-exports (nkeys.js).
import { createHash } from "node:crypto";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { homedir, userInfo } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { connect, credsAuthenticator, headers, nkeyAuthenticator, nkeys } from "nats";

const project = process.argv[2];
if (!project) {
  console.error("usage: node submit.mjs <project dir>");
  process.exit(2);
}
const dataDir = process.env.TAU_DATA_DIR || join(homedir(), ".tau");
const workspace = process.env.TAU_WORKSPACE || "default";
const timeoutMs = Number(process.env.TAU_FOLLOW_TIMEOUT_S || "300") * 1000;

// Signing: the local user's seed, a text file holding one SU… seed.
const seedText = readFileSync(join(dataDir, "creds", "user.nk"), "utf8");
const seed = seedText.match(/SU[A-Z2-7]{56}/)?.[0];
if (!seed) {
  console.error(`no user nkey seed in ${join(dataDir, "creds", "user.nk")}`);
  process.exit(2);
}
const user = nkeys.fromSeed(new TextEncoder().encode(seed));

// The code: a tar.gz of the project's regular files, paths relative to its root, in name order.
const SKIP = new Set([".git", ".venv", "venv", "__pycache__", "node_modules", ".tau", "outputs", "checkpoints"]);
function files(dir, prefix = "") {
  const out = [];
  for (const name of readdirSync(dir).sort()) {
    if (SKIP.has(name)) continue;
    const path = join(dir, name);
    const st = statSync(path);
    if (st.isDirectory()) out.push(...files(path, `${prefix}${name}/`));
    else if (st.isFile()) out.push([`${prefix}${name}`, readFileSync(path)]);
  }
  return out;
}
function tarHeader(name, size) {
  const h = Buffer.alloc(512);
  const put = (text, offset, length) => h.write(text, offset, length, "utf8");
  const octal = (n, length) => n.toString(8).padStart(length - 1, "0") + "\0";
  put(name, 0, 100);
  put(octal(0o644, 8), 100, 8);
  put(octal(0, 8), 108, 8);
  put(octal(0, 8), 116, 8);
  put(octal(size, 12), 124, 12);
  put(octal(0, 12), 136, 12);
  put("        ", 148, 8); // checksum computed over the header with this field as spaces
  put("0", 156, 1);
  put("ustar\0" + "00", 257, 8);
  let sum = 0;
  for (const b of h) sum += b;
  put(sum.toString(8).padStart(6, "0") + "\0 ", 148, 8);
  return h;
}
const parts = [];
for (const [name, data] of files(project)) {
  parts.push(tarHeader(name, data.length), data, Buffer.alloc((512 - (data.length % 512)) % 512));
}
parts.push(Buffer.alloc(1024));
const archive = gzipSync(Buffer.concat(parts));
const digestHex = createHash("sha256").update(archive).digest("hex");
const sourceObject = `sources/${digestHex}.tar.gz`;

// The submission: the run id is <dns label of the config's name>-<first 16 hex of sha256(submission_id)>.
const configText = readFileSync(join(project, "tau.yaml"), "utf8");
const name = (configText.match(/^name:\s*["']?([^"'\s#]+)/m)?.[1] || "run")
  .toLowerCase().replace(/[^a-z0-9-]/g, "-").replace(/-{2,}/g, "-").replace(/^-+|-+$/g, "").slice(0, 40)
  .replace(/-+$/, "") || "run";
const submissionId = `node${Date.now().toString(16)}${Math.random().toString(16).slice(2, 10)}`;
const runId = `${name}-${createHash("sha256").update(submissionId).digest("hex").slice(0, 16)}`;
const subject = `run.${workspace}.${runId}.submit.requested`;
const body = new TextEncoder().encode(JSON.stringify({
  submission_id: submissionId,
  config_text: configText,
  config_path: "tau.yaml",
  workspace,
  source_object: sourceObject,
  source_digest: `sha256:${digestHex}`,
  user: userInfo().username,
}));

const ceId = `${runId}.1.submit.requested`;
const ceType = "io.taugrid.run.submit.requested.v1";
const ceTime = new Date().toISOString(); // 2026-11-30T12:00:00.123Z
const canonical = ["tau-sig-v1", subject, ceId, ceType, runId, ceTime,
  createHash("sha256").update(body).digest("hex")].join("\n");
const h = headers();
for (const [k, v] of Object.entries({
  "ce-specversion": "1.0", "ce-id": ceId, "ce-type": ceType, "ce-source": "/svc/node-client",
  "ce-subject": runId, "ce-time": ceTime, "ce-workspace": workspace, "ce-attempt": "1",
  "content-type": "application/json",
  "tau-signer": user.getPublicKey(),
  "tau-signature": Buffer.from(user.sign(new TextEncoder().encode(canonical))).toString("base64url"),
})) h.set(k, v);

// Authentication: as the same user nkey (a server that requires none accepts it as well), or a .creds file.
const options = {
  servers: process.env.NATS_URL || "nats://127.0.0.1:4222", name: "taugrid-node-client",
  // The server lets each identity subscribe only to replies under its own inbox: _INBOX.<its public key>.
  inboxPrefix: `_INBOX.${user.getPublicKey()}`,
  authenticator: process.env.TAU_NATS_CREDS
    ? credsAuthenticator(readFileSync(process.env.TAU_NATS_CREDS))
    : nkeyAuthenticator(new TextEncoder().encode(seed)),
};
const nc = await connect(options);
const js = nc.jetstream();

// Snapshots are put into "uploads"; the submitter verifies the bytes against the name and promotes them into
// "sources", which only it may write. Skip the put when "sources" already has the name (it verified there).
const sources = await js.views.os("sources");
if (!(await sources.info(sourceObject))) {
  const uploads = await js.views.os("uploads");
  await uploads.putBlob({ name: sourceObject }, archive);
}

// Follow first (an ordered consumer delivers everything from the start), then publish and wait for the ack.
// A named consumer with one filter: it is created on $JS.API.CONSUMER.CREATE.RUNS.<name>.<filter>, the only
// create subject a person may use (its filter names their workspace).
const jsm = await nc.jetstreamManager({ checkAPI: false });
const consumerName = `node-${runId}`;
await jsm.consumers.add("RUNS", {
  name: consumerName, filter_subject: `run.${workspace}.${runId}.>`, ack_policy: "none",
  deliver_policy: "all", inactive_threshold: 120_000_000_000,
});
const consumer = await js.consumers.get("RUNS", consumerName);
const messages = await consumer.consume();
const ack = await js.publish(subject, body, { headers: h, msgID: ceId });
console.error(`submitted ${runId} (stream ${ack.stream} seq ${ack.seq})`);

const TERMINAL = new Set(["submit.rejected", "policy.rejected", "exec.succeeded", "exec.cancelled",
  "recovery.gave_up"]);
const seen = [];
const timer = setTimeout(() => {
  console.error(`timed out after ${timeoutMs / 1000}s; saw ${seen.join(", ")}`);
  process.exit(1);
}, timeoutMs);
let terminal = "";
for await (const m of messages) {
  const type = m.subject.split(".").slice(3).join(".");
  const data = m.json();
  seen.push(type);
  // a service's event leaves out what its subject says (docs/asyncapi.yaml, "Compact headers"): the run is the
  // subject's third token and the type io.taugrid.run.<stage>.<outcome>.v1
  console.log(JSON.stringify({
    type, run: m.headers?.get("ce-subject") || m.subject.split(".")[2],
    ce_type: m.headers?.get("ce-type") || `io.taugrid.run.${type}.v1`,
    user: m.headers?.get("ce-tauuser") || "", seq: m.seq, data,
  }));
  if (TERMINAL.has(type)) terminal = type;
  if (type === "evidence.sealed") break;
}
clearTimeout(timer);
await nc.close();
process.exit(terminal === "exec.succeeded" ? 0 : 1);
