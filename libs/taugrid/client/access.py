"""What one person may read: the workspaces whose runs, logs and evidence they see, decided from the platform's
users and the embedded stack's local user, the same rule the bus permissions are rendered from
(``access/permissions.person_permissions``). The CLI applies it to its own connection (``Client.readable_workspaces``);
the web portal, which reads with a service's connection, applies it per signed-in person on the server side."""

from __future__ import annotations

from dataclasses import dataclass

from taugrid.bus import platformstore
from taugrid.bus.connection import Bus
from taugrid.config.platform import load_platform


@dataclass(frozen=True)
class Viewer:
    name: str
    public_key: str
    role: str  # platform-admin | researcher | workspace-admin …, as the platform says
    workspaces: tuple[str, ...] | None  # None: every workspace (a platform admin, the stack's owner)
    local: bool = False  # the person who ran `tau up`

    def may_read(self, workspace: str) -> bool:
        return self.workspaces is None or workspace in self.workspaces

    def not_a_member(self, workspace: str) -> str:
        """Why this person may not submit into ``workspace``, in one sentence ("" when they may)."""
        if self.may_read(workspace):
            return ""
        mine = ", ".join(self.workspaces or ()) or "none"
        return (f"{self.name} is not a member of workspace {workspace} (theirs: {mine}): submit into one of "
                "them with --workspace NAME, or ask a platform admin to add them")


async def viewer(bus: Bus, public_key: str) -> Viewer | None:
    """The person whose nkey is ``public_key``, or None when the platform does not know them."""
    local = await platformstore.get_local_user(bus)
    if local is not None and local.nkey == public_key:
        return Viewer(local.name, public_key, "platform-admin", None, local=True)
    got = await platformstore.get_text(bus)
    platform = load_platform(got[0]) if got else None
    user = platform.user_by_nkey(public_key) if platform is not None else None
    if platform is None or user is None:
        return None
    if user.role == "platform-admin":
        return Viewer(user.name, public_key, user.role, None)
    return Viewer(user.name, public_key, user.role, tuple(platform.workspaces_of(user.name)))
