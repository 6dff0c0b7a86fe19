"""The storage proxy: virtual folders on volumes (a later issue completes it)."""
