"""Who signed a request: the signature checked (``envelope.verify_signature``), the key looked up among the
platform's users, or compared with the local user's key ``tau up`` registered (the stack's owner, a platform
admin whatever the platform lists). Used by the submitter (submissions) and the renderer (cancels).
"""

from __future__ import annotations

import time

from taugrid import settings
from taugrid.access import delegation
from taugrid.bus import platformstore
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import (
    SIGNATURE_HEADER,
    SIGNATURE_MAX_AGE_S,
    SIGNER_HEADER,
    Event,
    SignatureInvalid,
    staleness,
    verify_signature,
)
from taugrid.bus.platformread import PlatformReader
from taugrid.config.platform import Platform
from taugrid.core.contracts import Issue


class Refused(Exception):
    """A request that is not authorized; ``issue`` names the header or field and the fix."""

    def __init__(self, issue: Issue) -> None:
        super().__init__(issue.message)
        self.issue = issue


class Signers:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.reader = PlatformReader(bus)

    async def platform(self) -> Platform | None:
        """The newest valid platform revision (an invalid one is never used); None before any is applied."""
        got = await self.reader.get()
        return got[0] if got is not None else None

    async def platform_marked(self) -> tuple[Platform | None, str]:
        """``platform()`` and the token of the bucket's mark asked for it (``PlatformReader.get_marked``)."""
        got, token = await self.reader.get_marked()
        return (got[0] if got is not None else None), token

    async def local_user(self) -> platformstore.LocalUser | None:
        """The embedded stack's person: ``TAU_LOCAL_ADMIN`` (``<name>:<public key>``, set by the supervisor for
        its services) when set, else what ``tau up`` stored in the platform bucket."""
        name, _, key = settings.current().bus.local_admin.partition(":")
        if name and key:
            return platformstore.LocalUser(name=name, nkey=key)
        return await platformstore.get_local_user(self.bus)

    async def is_local_admin(self, signer: str) -> bool:
        local = await self.local_user()
        return local is not None and bool(signer) and local.nkey == signer

    def _delegator(self, ev: Event, signer: str) -> str:
        """The person a delegated request speaks for (``access/delegation.py``); ``Refused`` if the token fails."""
        try:
            return delegation.read(ev.delegation, delegate=signer, now=ev.stored or time.time()).user
        except SignatureInvalid as exc:
            raise Refused(Issue(
                field=delegation.HEADER, message=f"{ev.type} refused: {exc}",
                fix="sign in to the portal again (`tau portal` prints a new sign-in link)",
            )) from exc

    async def identify(self, ev: Event) -> tuple[str, str]:
        """(verified user name, signer public key) of a signed request; raises ``Refused`` with the reason. A
        request a service signed with a person's delegation token (``tau-delegation``) is that person's."""
        return await self.identify_on(ev, await self.platform())

    async def identify_on(self, ev: Event, platform: Platform | None) -> tuple[str, str]:
        """``identify`` against ``platform`` as the caller just read it (``platform()``), so a handler that needs
        the platform for more than the signer reads it once per request."""
        try:
            signer = verify_signature(ev)
        except SignatureInvalid as exc:
            raise Refused(Issue(
                field=SIGNATURE_HEADER, message=f"{ev.type} refused: {exc}",
                fix="sign requests with your nkey (the tau CLI and taugrid.client do; see docs/architecture.md §4)",
            )) from exc
        if ev.delegation:  # signed by a service (the portal) acting for the person whose token it carries
            signer = self._delegator(ev, signer)
        gap = staleness(ev)
        if gap is not None:
            raise Refused(Issue(
                field="ce-time",
                message=f"{ev.type} refused: signed at {ev.time!r}, but stored {gap:.0f} s apart from that; a "
                        f"signed request must reach the bus within {SIGNATURE_MAX_AGE_S:.0f} s of signing (a replay "
                        "of an old request is never honoured)",
                fix="send the request again (tau signs it anew); if it was just sent, check this machine's clock",
            ))
        local = await self.local_user()
        if local is not None and local.nkey == signer:
            return local.name, signer  # the stack's owner: platform admin whatever the platform lists
        if platform is not None and platform.users:
            user = platform.user_by_nkey(signer)
            if user is None:
                raise Refused(Issue(
                    field=SIGNER_HEADER,
                    message=f"{ev.type} refused: unknown signer {signer}: no user in the platform has this key",
                    fix="ask a platform admin to add your public key to platform.yaml users",
                ))
            return user.name, signer
        raise Refused(Issue(
            field=SIGNER_HEADER,
            message=f"{ev.type} refused: unknown signer {signer}: the platform lists no users, so only the "
                    "local user that `tau up` created is accepted",
            fix="sign with the key under $TAU_DATA_DIR/creds/, or list users in platform.yaml",
        ))
