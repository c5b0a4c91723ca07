"""An OS lock around the commits two runs race for (creating a table, writing the lease) when the
table is a path on this machine's file system.

Delta commits version N by writing its log file only if it does not exist yet. Cloud stores and
HDFS do that atomically; on a local file system the log store checks and then renames, so two
processes committing the same version in the same instant can both pass the check. Then one's
commit file replaces the other's, or ends up beside the other's checksum file, and the table cannot
be read again. An exclusive ``flock`` on a file next to the table makes the runs of one host take turns.
A file system shared between hosts (NFS) is not fenced this way: see docs/design.md, "The fence".
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from urllib.parse import urlparse

from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def lock_path(table: str) -> str | None:
    """The lock file for a table at a local path (``/data/audit``, ``var/audit``, ``file:/data/audit``):
    a hidden file beside the table's directory. None for a catalog name or a remote store."""
    if "/" not in table and ":" not in table:
        return None
    parsed = urlparse(table)
    if parsed.scheme not in ("", "file") or (parsed.scheme == "file" and parsed.netloc not in ("", "localhost")):
        return None
    path = (parsed.path if parsed.scheme else table).rstrip("/")
    parent, name = os.path.split(path)
    return os.path.join(parent, f".{name}.commit-lock")


@contextlib.contextmanager
def commit_lock(spark: SparkSession, table: str) -> Iterator[None]:
    """Hold this host's lock of ``table`` while its body commits. Nothing to hold for a remote table,
    or under Spark Connect, whose server (not this process) makes the commit."""
    path = lock_path(table)
    handle = None
    # A Connect session's class is from pyspark.sql.connect (run.spark_session.is_connect, a rank above).
    if path is not None and not type(spark).__module__.startswith("pyspark.sql.connect"):
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            handle = open(path, "a+b")  # noqa: SIM115 - closed below, which also releases the lock
        except OSError as exc:
            # A directory this run may not write beside the table: commit as Delta alone would.
            logger.warning("cannot create the commit lock %s (%s); committing without it", path, exc)
    if handle is None:
        yield
        return
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file closes, or this process dies
        yield
