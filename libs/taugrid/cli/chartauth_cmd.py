"""``tau admin chart-credentials``: the bus identities of a Kubernetes install, as Secrets to apply once.

Why on the operator's machine and not in a Job inside the cluster: the seeds then exist before anything is
installed (so the chart has no ordering hooks and works the same under ``helm install`` and GitOps tools that
apply plain manifests), the chart needs no RBAC to create Secrets in every workspace namespace, and the operator
can keep them in the store they already use for Secrets (sealed-secrets, an external secret manager). The
operator's own person is created here too; its seed never enters the cluster.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from taugrid.cli.common import EXIT_USAGE, emit_json, fail, output_option

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")  # config/platform.py PrincipalName
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _default_admin() -> str:
    from taugrid.stack.localuser import login_name

    name = login_name()
    return name if _NAME.match(name) else "admin"


@click.command("chart-credentials",
               help="Create (once, in --dir) the bus identities of a Kubernetes install and write the Secrets the "
                    "chart mounts: every service's nkey in the release namespace, the source fetch's in each "
                    "workspace namespace. Apply with `kubectl apply -f`. Re-running reuses the seeds.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("taugrid-credentials"), show_default=True,
              help="Where the seeds are kept (0700). Keep it private; it includes your own admin.nk.")
@click.option("--namespace", default="taugrid", show_default=True, help="The chart's release namespace.")
@click.option("--secret", default="taugrid-bus-credentials", show_default=True,
              help="Name of the services' Secret (chart value auth.secretName).")
@click.option("--workspace-namespace", "-n", "workspace_namespaces", multiple=True,
              help="A namespace where runs are created (repeatable): gets the source-fetch Secret.")
@click.option("--source-fetch-secret", default="taugrid-source-fetch", show_default=True,
              help="Name of the source-fetch Secret in each workspace namespace (chart value "
                   "sourceFetch.credsSecret).")
@click.option("--admin", "admin_name", default=None,
              help="Your user name on the platform (platform admin); default: your login name. Only used when "
                   "the seeds are first created.")
@click.option("--auth-conf", is_flag=True,
              help="Print nats-server's authorization block instead (for an existing NATS, nats.embedded.enabled "
                   "false); it admits the services and you, not the platform's people.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write there (mode 0600) instead of standard output.")
@output_option
def chart_credentials(directory: Path, namespace: str, secret: str, workspace_namespaces: tuple[str, ...],
                      source_fetch_secret: str, admin_name: str | None, auth_conf: bool, out: Path | None,
                      output: str) -> None:
    from taugrid.stack import chartauth

    admin_name = admin_name or _default_admin()
    if not _NAME.match(admin_name):
        fail(f"--admin {admin_name!r}: a user name is lower-case letters, digits, '-' and '_', starting with a "
             "letter (as in platform.yaml users)", EXIT_USAGE)
    for flag, value in [("--namespace", namespace), ("--secret", secret),
                        ("--source-fetch-secret", source_fetch_secret),
                        *(("--workspace-namespace", ns) for ns in workspace_namespaces)]:
        if not _DNS_LABEL.match(value):
            fail(f"{flag} {value!r} is not a valid Kubernetes name (lower-case letters, digits and '-')", EXIT_USAGE)
    seeds = chartauth.ensure_seeds(directory, admin_name=admin_name)
    if auth_conf:
        text = chartauth.render_conf(seeds.public(), None)
    else:
        text = chartauth.dump(chartauth.manifests(
            seeds, namespace=namespace, secret=secret, workspace_namespaces=workspace_namespaces,
            source_fetch_secret=source_fetch_secret))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.touch(mode=0o600)
        out.chmod(0o600)
        out.write_text(text)
    public = seeds.public()
    summary = {"directory": str(directory), "admin": public.admin.name, "admin_public_key": public.admin.public_key,
               "admin_creds": str(directory / chartauth.ADMIN_FILE), "services": public.services,
               "bootstrap": public.bootstrap, "out": str(out) if out else None,
               "anchor_public_key": seeds.anchor_signing.public_key if seeds.anchor_signing else None}
    if output == "json":
        if out is None:
            fail("--output json describes what was written: use it with --out FILE", EXIT_USAGE)
        emit_json(summary)
        return
    if out is None:
        click.echo(text, nl=False)
    click.echo(f"{'authorization block' if auth_conf else 'Secrets'} for {len(public.services)} services "
               f"{'in ' + str(out) if out else 'written'}; your own credentials ({public.admin.name}, platform "
               f"admin): {directory / chartauth.ADMIN_FILE} (`tau login --server tls://HOST:4222 --creds "
               f"{directory / chartauth.ADMIN_FILE} --ca ca.crt`)", err=True)
    if seeds.anchor_signing is not None:
        click.echo(f"audit anchors are signed by {seeds.anchor_signing.public_key}: check a copy of the anchor "
                   f"file with `tau verify RUN --anchor FILE --anchor-key {seeds.anchor_signing.public_key}` (any "
                   "other signer is refused)", err=True)


__all__ = ["chart_credentials"]
