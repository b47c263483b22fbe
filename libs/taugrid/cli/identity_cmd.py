"""``tau login``, ``tau whoami``, ``tau admin user add|remove|list``: people and their bus credentials.

A person's credentials are one nkey seed file (``bus/creds.py``). ``tau admin user add`` creates the key pair,
adds the public key to the stored platform as a new revision (which the server's users follow without a
restart) and writes the seed file to hand to that person, who stores it with ``tau login``. Removing a user is
a new revision too; the server then drops their connections and refuses new ones. The stored revision is where
people live (``config/platformdiff``): these commands edit it exactly, with a compare-and-set on the revision
read, and ``tau platform apply`` keeps whoever its file does not list.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from taugrid.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    connected,
    emit_json,
    fail,
    output_option,
    run_async,
)
from taugrid.config.platform import Platform, load_platform
from taugrid.config.source import load_yaml

EDIT_ATTEMPTS = 3  # read, edit and write the platform again when someone wrote it in between


@click.command(help="Store credentials for a remote taugrid bus: later commands use this server and key.")
@click.option("--server", required=True, help="NATS URL of the platform, e.g. tls://taugrid.example.org:4222.")
@click.option("--creds", "creds_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The credentials file your platform admin gave you (from `tau admin user add`).")
@click.option("--ca", "ca_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="PEM file of the CA that signed the bus's TLS certificate (a tls:// server with a private CA, "
                   "e.g. the ca.crt your platform admin exported from the chart's TLS Secret).")
@click.option("--check/--no-check", default=True, show_default=True, help="Connect once to check the key.")
@output_option
def login(server: str, creds_file: Path, ca_file: Path | None, check: bool, output: str) -> None:
    from taugrid.bus import creds
    from taugrid.client import locate
    from taugrid.core.errors import PermanentError

    try:
        identity = creds.load(creds_file)
    except PermanentError as err:
        fail(str(err), EXIT_USAGE)
        return
    stored = creds.write(locate.data_dir() / "creds" / "login.nk", identity,
                        comment=f"taugrid credentials for {server} (tau login); keep private")
    record = {"server": server, "creds": str(stored), "public_key": identity.public_key}
    if ca_file is not None:
        ca_copy = locate.data_dir() / "creds" / "login-ca.pem"
        ca_copy.write_bytes(ca_file.read_bytes())  # kept with the login: the original may be a download
        record["ca"] = str(ca_copy)
    if check:
        _check(server, stored, Path(record["ca"]) if "ca" in record else None)
    tmp = locate.login_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.chmod(tmp, 0o600)
    tmp.replace(locate.login_file())
    if output == "json":
        emit_json(record)
    else:
        click.echo(f"logged in to {server} as {identity.public_key} (credentials in {stored})")


@run_async
async def _check(server: str, creds_file: Path, ca: Path | None) -> None:
    from taugrid.client import open_client

    client = await open_client(server, creds=creds_file, ca=ca)
    await client.close()


@click.command(help="Who the bus knows you as: user, role and workspaces.")
@output_option
@run_async
async def whoami(output: str) -> None:
    from taugrid.bus import platformstore

    async with connected() as client:
        me = client.bus.identity
        platform = await _current_platform(client)
        local = await platformstore.get_local_user(client.bus)
        server = client.bus.nc.connected_url
    key = me.public_key if me else ""
    info: dict[str, Any] = {"server": server.geturl() if server else None, "public_key": key or None}
    user = platform.user_by_nkey(key) if key else None
    if user is not None:
        info.update(user=user.name, role=user.role, groups=user.groups,
                    workspaces=platform.workspaces_of(user.name),
                    admin_of=[w.name for w in platform.workspaces if user.name in platform.workspace_admins(w.name)])
    elif local is not None and local.nkey == key:
        info.update(user=local.name, role="platform-admin", groups=[], workspaces=[w.name for w in platform.workspaces],
                    admin_of=[w.name for w in platform.workspaces], local=True)
    elif not key:
        info.update(user=None, role=None, workspaces=[], note="connected without credentials (open bus)")
    else:
        info.update(user=None, role=None, workspaces=[], note="this key is not among the platform's users")
    if output == "json":
        emit_json(info)
        return
    if info.get("user") is None:
        click.echo(f"{info['note']}; public key {key or '-'} on {info['server']}")
        return
    click.echo(f"{info['user']} ({info['role']}{', local stack owner' if info.get('local') else ''}) "
               f"on {info['server']}")
    click.echo(f"  workspaces: {', '.join(info['workspaces']) or '-'}")
    if info["admin_of"]:
        click.echo(f"  admin of:   {', '.join(info['admin_of'])}")
    click.echo(f"  public key: {key}")


@click.group(help="Platform administration: people and their credentials.")
def admin() -> None:
    pass


@admin.group(help="Add, remove and list the people allowed on the bus.")
def user() -> None:
    pass


async def _platform_data(client: Any) -> tuple[dict[str, Any], int]:
    got = await client.platform_get()
    if got is None:
        fail("no platform applied yet: `tau platform apply FILE` first", EXIT_NOT_FOUND)
    # read as `tau platform apply` read it: the same bounds on what its aliases expand to
    data, _ = load_yaml(got[0], path="platform (stored)", what="platform.yaml")
    return data, int(got[1])


async def _edit(client: Any, command: str, change: Callable[[dict[str, Any]], None]) -> int:
    """Apply ``change`` to the stored platform as a new revision (its number): an exact edit of the revision read,
    redone on a fresh read when someone wrote in between; an invalid result is refused with the fix."""
    from taugrid.bus.kv import Conflict

    for attempt in range(EDIT_ATTEMPTS):
        data, revision = await _platform_data(client)
        change(data)
        text = "# edited by `tau admin user`\n" + yaml.safe_dump(data, sort_keys=False)
        where = f"platform ({command})"
        load_platform(text, path=where)
        try:
            return int(await client.platform_put(text, path=where, revision=revision))
        except Conflict:
            if attempt == EDIT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


async def _current_platform(client: Any) -> Platform:
    """The stack's platform, or an empty one (single-user mode) before any was applied."""
    got = await client.platform_get()
    return load_platform(got[0]) if got else Platform()


@user.command("add", help="Create NAME's key pair, add them to the platform (a new revision) and write their "
                          "credentials file to hand over.")
@click.argument("name")
@click.option("--workspace", "-w", "workspaces", multiple=True, help="Make NAME a member of this workspace "
              "(repeatable).")
@click.option("--role", type=click.Choice(["researcher", "platform-admin"]), default="researcher",
              show_default=True, help="platform-admin may also apply the platform and manage users.")
@click.option("--admin-of", "admin_of", multiple=True, help="Make NAME an admin of this workspace (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the credentials (default ./NAME.nk, mode 0600).")
@output_option
@run_async
async def add_user(name: str, workspaces: tuple[str, ...], role: str, admin_of: tuple[str, ...], out: Path | None,
                   output: str) -> None:
    from taugrid.bus import creds

    out = out or Path(f"{name}.nk")
    if out.exists():
        fail(f"{out} exists; choose another --out (credentials are never overwritten)", EXIT_USAGE)
    identity = creds.new_identity(name)

    def add(data: dict[str, Any]) -> None:
        users = data.get("users") or []
        data["users"] = users
        if any(isinstance(u, dict) and u.get("name") == name for u in users):
            fail(f"user {name!r} already exists; remove them first to issue a new key", EXIT_USAGE)
        users.append({"name": name, "nkey": identity.public_key, "role": role})
        known = {w.get("name"): w for w in data.get("workspaces") or [] if isinstance(w, dict)}
        for key, wanted in (("members", workspaces), ("admins", admin_of)):
            for ws in wanted:
                if ws not in known:
                    fail(f"no workspace {ws!r}; use one of: {', '.join(sorted(map(str, known))) or '(none)'}",
                         EXIT_NOT_FOUND)
                known[ws][key] = [*(known[ws].get(key) or []), name]

    async with connected() as client:
        revision = await _edit(client, "tau admin user add", add)
    creds.write(out, identity, comment=f"taugrid credentials for {name}; give them only to {name}; "
                                       "use with `tau login --server URL --creds FILE`")
    result = {"user": name, "public_key": identity.public_key, "role": role, "workspaces": list(workspaces),
              "creds": str(out), "revision": revision}
    if output == "json":
        emit_json(result)
    else:
        click.echo(f"user {name} added (platform revision {revision}); credentials in {out} (hand them over "
                   "privately; they log in with `tau login --server URL --creds FILE`)")


@user.command("remove", help="Remove NAME from the platform (a new revision): their connections are closed and "
                             "their key refused at once.")
@click.argument("name")
@output_option
@run_async
async def remove_user(name: str, output: str) -> None:
    def remove(data: dict[str, Any]) -> None:
        users = data.get("users") or []
        kept = [u for u in users if not (isinstance(u, dict) and u.get("name") == name)]
        if len(kept) == len(users):
            fail(f"no user {name!r} (see `tau admin user list`)", EXIT_NOT_FOUND)
        data["users"] = kept
        for ws in data.get("workspaces") or []:
            for key in ("members", "admins"):
                if isinstance(ws, dict) and name in (ws.get(key) or []):
                    ws[key] = [m for m in ws[key] if m != name]

    async with connected() as client:
        revision = await _edit(client, "tau admin user remove", remove)
    if output == "json":
        emit_json({"user": name, "removed": True, "revision": revision})
    else:
        click.echo(f"user {name} removed (platform revision {revision})")


@user.command("list", help="The platform's users with role, groups and workspaces.")
@output_option
@run_async
async def list_users(output: str) -> None:
    async with connected() as client:
        platform = await _current_platform(client)
    rows = [{"user": u.name, "role": u.role, "groups": u.groups, "workspaces": platform.workspaces_of(u.name),
             "public_key": u.nkey} for u in platform.users]
    if output == "json":
        emit_json(rows)
        return
    if not rows:
        click.echo("no users: single-user mode (only the person who ran `tau up`)")
        return
    click.echo(f"{'USER':<16} {'ROLE':<15} {'WORKSPACES':<30} PUBLIC KEY")
    for r in rows:
        click.echo(f"{r['user']:<16} {r['role']:<15} {','.join(r['workspaces']) or '-':<30} {r['public_key']}")


def _add_chart_credentials() -> None:
    from taugrid.cli.chartauth_cmd import chart_credentials

    admin.add_command(chart_credentials)


_add_chart_credentials()

__all__ = ["admin", "login", "whoami"]
