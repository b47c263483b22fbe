"""Many clusters on Kubernetes (docs §13d "On Kubernetes"): what ``tau up``'s supervisor does for its sites
(``stack.sites.Sites.provision``), as the two commands the chart's Jobs run.

- ``hub --platform FILE`` (the hub's bootstrap Job, after the bus bootstrap, as the bootstrap identity): for each
  cluster the platform names, the durable on BACKEND that feeds its ``SITE_IN``, its ``SITE_<CLUSTER>`` stream
  sourcing its ``SITE_OUT``, the dispatcher's durable there, and the lease and capacity buckets
  (``bus.sites.provision_hub``).
- ``site --cluster NAME --service-keys IDENTITIES_JSON --platform FILE`` (a site's Job, ``site.enabled``, as the
  site's own bootstrap identity, against its leaf server): ``SITE_IN``, ``SITE_OUT``, the DLQ and the site's buckets
  with the hub's services' public keys (``bus.sites.provision_site``: the site acts only on requests they signed),
  and the platform copied into its ``platform`` bucket.

Invariants: idempotent (both run on every install and upgrade); nothing here decides where a run goes; the hub's
keys are public keys only (its identities.json), never a seed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from taugrid.bus import sites as bus_sites
from taugrid.bus.connection import Bus, connect
from taugrid.bus.platformstore import get_text, put_text
from taugrid.config.platform import load_platform
from taugrid.core.errors import ConfigError, PermanentError


def clusters_of(platform_text: str, *, where: str) -> list[str]:
    """The clusters ``platform_text`` names, in its order."""
    return [c.name for c in load_platform(platform_text, path=where).clusters]


async def provision_hub(hub: Bus, platform_text: str, *, where: str = "platform.yaml") -> list[str]:
    """The hub's side of every cluster's link; the clusters provisioned."""
    names = clusters_of(platform_text, where=where)
    for name in names:
        await bus_sites.provision_feed(hub, name)  # before the site's SITE_IN sources it
        await bus_sites.provision_hub(hub, name)
    return names


def hub_service_keys(identities: Path) -> dict[str, str]:
    """The hub's services' public keys from its identities.json (`tau admin chart-credentials`)."""
    try:
        keys = json.loads(identities.read_text())["services"]
        return {str(k): str(v) for k, v in keys.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PermanentError(f"{identities}: not the hub's identities.json ({exc!r}); put the hub's credentials "
                             "Secret's identities.json into site.hub.identitiesSecret") from exc


async def provision_site(site: Bus, cluster: str, platform_text: str, service_keys: dict[str, str], *,
                         where: str = "platform.yaml") -> None:
    """A site's side of its link, and the platform it admits by (the hub's, copied)."""
    _check_site(cluster, clusters_of(platform_text, where=where))
    await bus_sites.provision_site(site, cluster, service_keys=service_keys, buckets=bus_sites.KUBE_SITE_BUCKETS)
    got = await get_text(site)
    if got is None or got[0] != platform_text:
        await put_text(site, platform_text)


def _check_site(cluster: str, names: list[str]) -> None:
    if cluster not in names:
        raise PermanentError(f"site.cluster {cluster!r} is not among the platform's clusters {names}: name the "
                             "cluster as platform.yaml's clusters do")


async def _run(args: argparse.Namespace) -> int:
    text = args.platform.read_text()
    names = clusters_of(text, where=str(args.platform))  # what cannot work is refused before connecting
    keys: dict[str, str] = {}
    if args.command == "site":
        _check_site(args.cluster, names)
        keys = hub_service_keys(args.service_keys)
    bus = await connect(args.url, name=f"chartsites-{args.command}")
    try:
        if args.command == "hub":
            await provision_hub(bus, text, where=str(args.platform))
            print(f"hub: provisioned the links of {', '.join(names) or 'no cluster'}")
        else:
            await provision_site(bus, args.cluster, text, keys, where=str(args.platform))
            print(f"site {args.cluster}: provisioned, platform copied")
    finally:
        await bus.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taugrid.stack.chartsites", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["hub", "site"])
    ap.add_argument("--url", help="the bus (default TAU_NATS_URL)")
    ap.add_argument("--platform", type=Path, required=True, help="the platform.yaml naming the clusters")
    ap.add_argument("--cluster", help="site: this site's cluster")
    ap.add_argument("--service-keys", type=Path, help="site: the hub's identities.json (public keys)")
    args = ap.parse_args(argv)
    if args.command == "site" and not (args.cluster and args.service_keys):
        ap.error("site needs --cluster and --service-keys")
    try:
        return asyncio.run(_run(args))
    except (ConfigError, PermanentError, OSError) as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
