"""Warm pools in the hub's admin REST API (issue 30): superadmins set, per resource
group, how many kernels of an image and a preset are kept started and unassigned, and
read each pool's fill, hits, misses and why it cannot fill. Rules and the pool itself:
:mod:`..manager.warmpool`."""

from __future__ import annotations

from . import models
from .base import APIBase
from .spec import Op, route


class WarmPoolsHandler(APIBase):
    async def get(self):
        _, offset, limit = self.query({})
        self.reply(await self.manager.ops.list_warm_pools(self.principal, offset, limit))

    async def put(self):
        self.query()
        body = self.body("WarmPoolSet")
        out = await self.manager.ops.set_warm_pool(self.principal, body)
        self.manager.warmpool.kick(now=True)
        self.reply(out)


# Declared once: the tornado URL list and the OpenAPI document's paths are made from these.
ROUTES = [
    route("/warm-pools", WarmPoolsHandler,
          get=Op("listWarmPools", "The warm pools: size, kernels ready, hits, misses, why one "
                 "cannot fill (superadmin)", filters={}, response=models.WarmPool),
          put=Op("setWarmPool", "Set how many kernels of an image and preset a resource group "
                 "keeps warm; 0 removes the pool (superadmin)", body=models.WarmPoolSet,
                 response=models.WarmPool)),
]
