"""The labels the Docker backend puts on its containers and networks (what a restarted
agent rebuilds its state from)."""

from ...common.installation import LABEL as L_INSTALLATION

L_KERNEL = "ai.backend.kernel-id"
L_SESSION = "ai.backend.session-id"
L_OWNER = "ai.backend.owner"
L_AGENT = "ai.backend.agent-id"
L_PORTS = "ai.backend.service-ports-bound"
L_DEVICES = "ai.backend.cuda-devices"
# gpu-topology: the devices / MIG instances by UUID (ownership rebuilt from it on restart).
L_UUIDS = "ai.backend.cuda-uuids"
L_TYPE = "ai.backend.kernel-type"
L_NETWORK = "ai.backend.network"
#: The kernel's own CPU limit (NanoCpus) when it started with a burst (startup_cpus):
#: a restarted agent applies it to a kernel it left mid-start.
L_NANO_CPUS = "ai.backend.nano-cpus"
#: The slots the kernel asked for (JSON), for the agent's statistics after a restart.
L_SLOTS = "ai.backend.slots"

__all__ = ["L_AGENT", "L_DEVICES", "L_INSTALLATION", "L_KERNEL", "L_NANO_CPUS", "L_NETWORK",
           "L_OWNER", "L_PORTS", "L_SESSION", "L_SLOTS", "L_TYPE", "L_UUIDS"]
