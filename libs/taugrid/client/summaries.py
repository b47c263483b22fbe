"""Plain readings of bus state for people, shared by the command line and the web portal: one line of detail per
event (``event_detail``), one row per node (``node_rows``, with a local pool node's topology domain from
``pool_domains``). The CLI adds colour and tables (``cli.views``), the portal serves them as JSON; neither keeps
its own copy, and the portal never imports the command line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from taugrid.core.heartbeat import silent, silent_after
from taugrid.core.states import resize_text

if TYPE_CHECKING:
    from taugrid.bus.envelope import Event


def event_detail(ev: Event) -> str:
    """What an event says, in one line (``tau events``, ``tau run --follow``, the portal's event list)."""
    try:
        data = ev.as_dict()
    except msgspec.DecodeError as exc:  # one hostile event must not end the listing: show it as what it is
        return f"undecodable payload ({len(ev.data)} bytes): {exc}"
    if ev.type == "exec.progress":  # where the pod is: its first phase not yet through, with the detail
        ahead = [p for p in data.get("phases") or [] if p.get("status") not in ("done", "skipped")]
        where = f"{ahead[0]['name']} {ahead[0]['status']} {ahead[0].get('detail', '')}" if ahead else "started"
        return f"{data.get('pod') or 'raycluster'}: {where}".strip()
    if ev.type == "recovery.retrying":  # decided at once; the backoff is a wait before the next attempt
        delay = float(data.get("delay_s") or 0)
        wait = f"; backoff: it starts in {delay:g}s" if delay > 0 else ""
        return f"attempt {data.get('attempt')} after {data.get('reason') or data.get('classification')}{wait}"
    if ev.type == "exec.resized":  # an elastic run: old -> new pods and why
        return resize_text(data)
    if ev.type.endswith("rejected"):
        reasons = data.get("reasons") or []
        return "; ".join(f"{r.get('field')}: {r.get('message')}" for r in reasons)[:300]
    for key in ("reason", "message", "node", "exit_code", "digest", "object_name", "cluster_queue"):
        if data.get(key) not in (None, "", []):
            return f"{key}={data[key]}"
    return ""


def pool_domains(platform_text: str) -> dict[str, dict[str, str]]:
    """Per declared local node, its value at each level of the platform's topologies above the hostname, highest
    first (the node's name is its hostname domain); {} when the platform declares none or does not load."""
    from taugrid.config.platform import load_platform
    from taugrid.config.platformtopology import HOSTNAME_LABEL, node_labels
    from taugrid.core.errors import TauError

    try:
        platform = load_platform(platform_text)
    except (TauError, ValueError):
        return {}
    levels = list(dict.fromkeys(k for t in platform.topologies for k in t.levels if k != HOSTNAME_LABEL))
    return {n.name: {k: labels[k] for k in levels if k in labels}
            for n in platform.local.nodes for labels in (node_labels(n),)} if levels else {}


def node_rows(states: list[Any], records: list[Any], now: float,
              domains: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """One plain dict per node (what ``--output json`` prints), sorted by name; runs not yet finished only.
    ``domains``: each node's topology domain (``pool_domains``), label → value."""
    live = ("admitted", "running", "queued")
    domains = domains or {}
    out = []
    for st in sorted(states, key=lambda s: s.node):
        failing = {key: f"{c.reason or c.type}{': ' + c.message if c.message else ''}"
                   for key, c in sorted(st.conditions.items()) if c.status == "True"}
        runs = sorted(r.run_id for r in records if r.state in live and on_node(r, st.node))
        out.append({"node": st.node, "verdict": st.verdict, "gpus": st.expected_gpus, "gpu_source": st.gpu_source,
                    "gpu_vendor": st.gpu_vendor, "gpu_model": st.gpu_model,
                    "cordoned": st.cordoned, "cordon_reason": st.cordon_reason,
                    "cordoned_for_s": round(now - st.cordon_time, 1) if st.cordoned and st.cordon_time else None,
                    "drained": st.drained, "conditions": failing, "last_validation": st.last_validation,
                    "repair": {"wanted": st.repair_wanted, "steps": st.repairs, "last": st.last_repair},
                    "last_sample_age_s": round(now - st.last_sample, 1) if st.last_sample else None,
                    "silent": silent(st.last_sample, st.heartbeat_s, now),
                    "silent_after_s": silent_after(st.heartbeat_s), "runs": runs,
                    "domain": domains.get(st.node, {})})
    return out


def gpu_kind(row: dict[str, Any]) -> str:
    """A node row's GPUs as ``vendor/model`` (``amd/amd-mi300x``, ``nvidia/NVIDIA H100 80GB HBM3``); "-" unknown."""
    vendor, model = row.get("gpu_vendor") or "", row.get("gpu_model") or ""
    return f"{vendor}/{model}" if vendor and model else vendor or "-"


def on_node(record: Any, node: str) -> bool:
    """The run has a pod there (a multi-node run is on each of its pods' nodes), or reported the node itself."""
    return record.node == node or any(p.node == node for p in record.pods)
