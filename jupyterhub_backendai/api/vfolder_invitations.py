"""Vfolder invitations in the hub's admin REST API (the same as ``backend.ai vfolder
invite`` / ``invitations``, :mod:`.compat`): the owner of a user folder invites a user of
its domain, who accepts (the folder is shared with the invitation's permission) or
declines; the inviter may withdraw a pending one. Rules: :mod:`..manager.vfolders`."""

from __future__ import annotations

from ..manager import vfolders
from .base import APIBase


class InvitationsHandler(APIBase):
    """``GET /vfolder-invitations``: the caller's pending invitations, received."""

    async def get(self):
        _, offset, limit = self.query({})
        items = await self.manager.db_read(vfolders.list_invitations, self.principal)
        self.reply({"items": items[offset:offset + limit], "total": len(items),
                    "offset": offset, "limit": limit})


class VFolderInviteHandler(APIBase):
    """``POST /vfolders/{id}/invitations`` ``{"email", "permission"}``."""

    async def post(self, fid):
        self.query()
        body = self.body("VFolderInvitationCreate")
        made = await self.manager.db(vfolders.invite, self.principal, fid, [body["email"]],
                                     body.get("permission", "ro"))
        self.reply(made[0], 201)


class InvitationActionHandler(APIBase):
    """``POST /vfolder-invitations/{id}/accept`` (the invitee) and ``.../decline`` (the
    invitee declines, the inviter withdraws)."""

    def initialize(self, action: str):
        self.action = action

    async def post(self, inv_id):
        self.query()
        fn = vfolders.accept_invitation if self.action == "accept" else vfolders.decline_invitation
        self.reply(await self.manager.db(fn, self.principal, inv_id))


def routes(prefix: str) -> list[tuple]:
    seg = r"([^/]+)"
    return [
        (f"{prefix}/vfolder-invitations", InvitationsHandler),
        (f"{prefix}/vfolders/{seg}/invitations", VFolderInviteHandler),
        (f"{prefix}/vfolder-invitations/{seg}/accept", InvitationActionHandler,
         {"action": "accept"}),
        (f"{prefix}/vfolder-invitations/{seg}/decline", InvitationActionHandler,
         {"action": "decline"}),
    ]
