"""The agent: one per node; runs kernels with a backend (Docker or local processes)."""
