"""Every use of Delta: the audit, checkpoint and lease tables."""
