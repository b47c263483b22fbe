"""Multi-node torchrun on one machine: the rendered Indexed Job rendezvouses at ``<job>-0.<service>`` (a headless
Service's DNS name), which does not exist here. Point it at loopback on a port of the workload's own, so several
multi-node runs on one box never share a rendezvous store.

Invariant: in an elastic command (``--nnodes=MIN:MAX``), with a pod's ``index``, only pod 0 hosts the c10d store
(``--rdzv_conf=is_host=...``). On Kubernetes only pod 0's address matches ``<job>-0.<service>``; on loopback every
pod's does, and torchrun would let whichever agent started first host the store, so an elastic shrink stopping that
pod would take the store, and the run, with it (a shrink never stops pod 0). A fixed-size run's pods live and end
together, so its command is left as rendered.
"""

from __future__ import annotations

import re

_ENDPOINT = "--rdzv_endpoint="
_CONF = "--rdzv_conf="


def local_command(command: list[str], *, job: str, subdomain: str, port: int, index: int | None = None) -> list[str]:
    """Rewrite ``<job>-0.<subdomain>[:29500]`` endpoints to ``127.0.0.1:<port>``; other args are untouched, except
    that with ``index``, in an elastic command, a rewritten ``--rdzv_endpoint=`` gets ``is_host`` (true for pod 0
    only) added to the command's ``--rdzv_conf=`` (one is added after the endpoint when the command has none)."""
    if not subdomain:
        return list(command)
    host = re.escape(f"{job}-0.{subdomain}")
    pattern = re.compile(rf"{host}(?::\d+)?")
    out = [pattern.sub(f"127.0.0.1:{port}", arg) for arg in command]
    rewritten = [i for i, (old, new) in enumerate(zip(command, out, strict=True))
                 if old != new and old.startswith(_ENDPOINT)]
    elastic = any(arg.startswith("--nnodes=") and ":" in arg for arg in command)
    if index is None or not rewritten or not elastic:
        return out
    is_host = f"is_host={'true' if index == 0 else 'false'}"
    confs = [i for i, arg in enumerate(out) if arg.startswith(_CONF)]
    if confs:
        i = confs[-1]  # torchrun keeps the last one given
        kept = [kv for kv in out[i][len(_CONF):].split(",") if kv and not kv.startswith("is_host=")]
        out[i] = _CONF + ",".join([*kept, is_host])
    else:
        out.insert(rewritten[0] + 1, _CONF + is_host)
    return out
