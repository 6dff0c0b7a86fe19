"""Backend.AI's cluster model (domains, projects, keypairs, scheduler, agents) for JupyterHub."""

__version__ = "0.1.0"
