"""The host lock around racing Delta commits on local paths (storage/commit_lock.py)."""

import threading
import time

import pytest

from backlog_syphon.storage.commit_lock import commit_lock, lock_path


@pytest.mark.parametrize(("table", "expected"), [
    ("/data/state/audit", "/data/state/.audit.commit-lock"),
    ("/data/state/audit/", "/data/state/.audit.commit-lock"),
    ("var/local/tables/checkpoint_lease", "var/local/tables/.checkpoint_lease.commit-lock"),
    ("file:/data/state/audit", "/data/state/.audit.commit-lock"),
    ("file:///data/state/audit", "/data/state/.audit.commit-lock"),
])
def test_a_local_path_has_a_lock_file_beside_it(table, expected):
    assert lock_path(table) == expected


@pytest.mark.parametrize("table", [
    "syphon_audit", "main.syphon.audit",
    "abfss://state@account.dfs.core.windows.net/syphon/audit", "dbfs:/syphon/audit",
    "s3://bucket/syphon/audit", "file://otherhost/data/audit",
])
def test_a_catalog_name_or_a_remote_store_has_none(table):
    assert lock_path(table) is None


class _ClassicSession:
    """Stands in for a classic SparkSession: commit_lock only asks which module its type is from."""


def test_a_second_holder_waits_until_the_first_is_done(tmp_path):
    table = str(tmp_path / "tables" / "lease")
    order: list[str] = []
    first_holds = threading.Event()

    def first():
        with commit_lock(_ClassicSession(), table):
            first_holds.set()
            time.sleep(0.3)
            order.append("first done")

    def second():
        first_holds.wait()
        with commit_lock(_ClassicSession(), table):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == ["first done", "second in"]
    assert (tmp_path / "tables" / ".lease.commit-lock").exists()


def test_different_tables_do_not_wait_for_each_other(tmp_path):
    with commit_lock(_ClassicSession(), str(tmp_path / "audit")):
        entered = threading.Event()
        other = threading.Thread(target=lambda: _enter(str(tmp_path / "checkpoint"), entered))
        other.start()
        assert entered.wait(5)
        other.join(5)


def _enter(table, entered):
    with commit_lock(_ClassicSession(), table):
        entered.set()


def test_a_directory_it_cannot_write_leaves_the_commit_unlocked_with_a_warning(tmp_path, caplog):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the table's parent directory would be")
    with commit_lock(_ClassicSession(), str(blocked / "audit")):
        pass
    assert "cannot create the commit lock" in caplog.text and ".audit.commit-lock" in caplog.text
