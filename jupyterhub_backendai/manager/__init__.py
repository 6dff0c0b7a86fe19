"""The manager core: state, scheduler loop, event consumer, agent clients. No web handlers."""
