"""Multi-node torchrun on one machine: the rendered Indexed Job rendezvouses at ``<job>-0.<service>`` (a headless
Service's DNS name), which does not exist here. Point it at loopback on a port of the workload's own, so several
multi-node runs on one box never share a rendezvous store."""

from __future__ import annotations

import re


def local_command(command: list[str], *, job: str, subdomain: str, port: int) -> list[str]:
    """Rewrite ``<job>-0.<subdomain>[:29500]`` endpoints to ``127.0.0.1:<port>``; other args are untouched."""
    if not subdomain:
        return list(command)
    host = re.escape(f"{job}-0.{subdomain}")
    pattern = re.compile(rf"{host}(?::\d+)?")
    return [pattern.sub(f"127.0.0.1:{port}", arg) for arg in command]
