"""Scheduling: which pending session goes to which agent, committed in one transaction."""
