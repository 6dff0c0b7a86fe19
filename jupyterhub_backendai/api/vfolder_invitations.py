"""Vfolder invitations in the hub's admin REST API (the same as ``backend.ai vfolder
invite`` / ``invitations``, :mod:`.compat`): the owner of a user folder invites a user of
its domain, who accepts (the folder is shared with the invitation's permission) or
declines; the inviter may withdraw a pending one. Rules: :mod:`..manager.vfolders`."""

from __future__ import annotations

from . import models
from .base import APIBase
from .spec import Op, route


class InvitationsHandler(APIBase):
    """``GET /vfolder-invitations``: the caller's pending invitations, received."""

    async def get(self):
        _, offset, limit = self.query({})
        items = await self.manager.ops.list_invitations(self.principal)
        self.reply({"items": items[offset:offset + limit], "total": len(items),
                    "offset": offset, "limit": limit})


class VFolderInviteHandler(APIBase):
    """``POST /vfolders/{id}/invitations`` ``{"email", "permission"}``."""

    async def post(self, fid):
        self.query()
        body = self.body("VFolderInvitationCreate")
        made = await self.manager.ops.invite(self.principal, fid, [body["email"]],
                                             body.get("permission", "ro"))
        self.reply(made[0], 201)


class InvitationActionHandler(APIBase):
    """``POST /vfolder-invitations/{id}/accept`` (the invitee) and ``.../decline`` (the
    invitee declines, the inviter withdraws)."""

    def initialize(self, action: str):
        self.action = action

    async def post(self, inv_id):
        self.query()
        answer = (self.manager.ops.accept_invitation if self.action == "accept"
                  else self.manager.ops.decline_invitation)
        self.reply(await answer(self.principal, inv_id))


# Declared once: the tornado URL list and the OpenAPI document's paths are made from these.
ROUTES = [
    route("/vfolders/{id}/invitations", VFolderInviteHandler,
          post=Op("inviteToVFolder", "Invite a user of its domain to a user folder (owner); "
                  "the folder is shared once they accept", body=models.VFolderInvitationCreate,
                  status=201, response=models.VFolderInvitation)),
    route("/vfolder-invitations", InvitationsHandler,
          get=Op("listVFolderInvitations", "The caller's pending invitations (received)",
                 filters={}, response=models.VFolderInvitation)),
    route("/vfolder-invitations/{id}/accept", InvitationActionHandler, {"action": "accept"},
          post=Op("acceptVFolderInvitation", "Accept an invitation (the invitee): the folder "
                  "is shared with its permission", response=models.VFolderInvitation)),
    route("/vfolder-invitations/{id}/decline", InvitationActionHandler, {"action": "decline"},
          post=Op("declineVFolderInvitation", "Decline an invitation (the invitee), or "
                  "withdraw it (the inviter)", response=models.VFolderInvitation)),
]
