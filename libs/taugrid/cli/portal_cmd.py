"""``tau portal``: a sign-in link to the web portal. The link carries a session token that this person signs
with their nkey for the portal's key (``taugrid.access.delegation``), so the portal knows who they are without a
password and can cancel runs for them with the same authority ``tau cancel`` has, until the token expires."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import quote

import click

from taugrid.cli.common import EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_USAGE, data_dir, emit_json, fail, output_option
from taugrid.cli.stackstate import running

DEFAULT_TTL = "12h"
DEFAULT_TTL_S = 12 * 3600.0


def sign_in_url(base_url: str, *, delegate: str, seed: bytes, ttl_s: float) -> str:
    """``<base>/login?token=…`` with a session token by ``seed``'s person for the portal whose key is ``delegate``."""
    from taugrid.access.delegation import issue

    return f"{base_url.rstrip('/')}/login?token={quote(issue(seed, delegate=delegate, ttl_s=ttl_s))}"


def stack_portal(state: dict[str, object]) -> tuple[str, str] | None:
    """(URL, public key) of the embedded stack's portal, from ``stack.json``."""
    portal = state.get("portal")
    if isinstance(portal, dict) and portal.get("url") and portal.get("key"):
        return str(portal["url"]), str(portal["key"])
    return None


def _ttl(text: str) -> float:
    units = {"m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].isdigit() and int(text[:-1]) > 0:
        return float(int(text[:-1]) * units[text[-1]])
    fail(f"--ttl {text!r}: use a duration like 30m, 12h or 7d (at most 7d)", EXIT_USAGE)
    raise AssertionError


def _remote_key(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/portal", timeout=10) as response:  # noqa: S310
            return str(json.load(response)["delegate"])
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        fail(f"cannot reach the portal at {url}: {exc}", EXIT_UNAVAILABLE)
        raise AssertionError from exc


@click.command(help="Print a sign-in link to the web portal (runs, live logs, evidence, queues, nodes, usage), "
                    "signed with your key; it lasts --ttl. Without --url, the embedded stack's portal.")
@click.option("--url", default=None, help="The portal's address, e.g. https://tau.example.org (default: the stack's).")
@click.option("--ttl", default=DEFAULT_TTL, show_default=True, help="How long the session lasts (30m, 12h, 7d).")
@click.option("--run", "run_id", default=None, help="Open on this run's page (the link ends in #/runs/RUN).")
@output_option
def portal(url: str | None, ttl: str, run_id: str | None, output: str) -> None:
    from taugrid.bus.identity import load_user_seed

    ttl_s = _ttl(ttl)
    if url:
        base, key = url, _remote_key(url)
    else:
        state = running(data_dir())
        found = stack_portal(state) if state else None
        if found is None:
            fail(f"no running stack with a portal (data dir {data_dir()}): start it with `tau up`, or pass --url",
                 EXIT_UNAVAILABLE)
            return
        base, key = found
    seed = load_user_seed()
    if seed is None:
        fail("no key to sign in with: `tau login --creds FILE`, TAU_NKEY_FILE, or the stack's creds/user.nk",
             EXIT_NOT_FOUND)
        return
    link = sign_in_url(base, delegate=key, seed=seed, ttl_s=ttl_s)
    if run_id:  # the sign-in redirect keeps the fragment: the page opens on the run
        link += f"#/runs/{quote(run_id, safe='')}"
    if output == "json":
        emit_json({"url": base, "sign_in_url": link, "ttl_s": ttl_s})
        return
    click.echo(f"open this link to sign in to the portal (valid {ttl}; it is a credential, keep it private):")
    click.echo(link)
