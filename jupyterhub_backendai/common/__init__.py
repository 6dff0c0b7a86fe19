"""Pieces shared by the hub, the agent and the storage proxy (none of them imports the others)."""
