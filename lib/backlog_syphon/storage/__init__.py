"""Every use of Delta: the audit, checkpoint, lease and runs tables, over what they share (``delta``)."""
