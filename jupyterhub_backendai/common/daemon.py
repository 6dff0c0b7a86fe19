"""What the node daemons (``backendai-agent``, ``backendai-storage-proxy``) share: a
config file, their API's authentication settings (:class:`.httpbase.NodeAuthConfig`),
running until SIGTERM or SIGINT, and the console script's ``main``."""

from __future__ import annotations

import asyncio
import logging
import signal

from traitlets import Unicode
from traitlets.config import Application

from .httpbase import NodeAuthConfig


class NodeDaemon(NodeAuthConfig, Application):
    """Base of a daemon's application: ``run()`` serves until :meth:`until_stopped`."""

    config_file = Unicode("", help="Config file to load (Python, traitlets).").tag(config=True)

    def initialize(self, argv=None):
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)

    async def run(self) -> None:
        raise NotImplementedError

    @staticmethod
    async def until_stopped() -> None:
        """Return once the process is asked to stop (SIGTERM, or SIGINT: Ctrl-C)."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    @classmethod
    def main(cls, argv=None) -> None:
        """The console script: configure from ``argv`` (and the config file), run."""
        logging.basicConfig(level=logging.INFO)
        app = cls()
        app.initialize(argv)
        asyncio.run(app.run())
