"""The scheduler index answers disk lookups from a listing while the directory is unchanged."""

from __future__ import annotations

import os
import time

from lmcache_ec.integration.vllm.index import TierIndex
from lmcache_ec.key import EncoderIdentity

IDENTITY = EncoderIdentity(model="listing/model")
OLD = 1_000_000_000  # a directory time long past: a listing of it is not racy


def _entry(directory, item: str):
    return directory / f"{IDENTITY.storage_name(item)}.pt"


def _index(directory) -> TierIndex:
    return TierIndex(IDENTITY, disk_dir=str(directory), open_catalog=None, negative_ttl=0)


def _wait_current(index: TierIndex) -> None:
    deadline = time.monotonic() + 30
    while not index._disk.current():
        assert time.monotonic() < deadline, "the listing never became current"
        time.sleep(0.01)


def test_unchanged_directory_is_answered_from_the_listing(tmp_path):
    _entry(tmp_path, "a" * 64).write_bytes(b"frame")
    os.utime(tmp_path, ns=(OLD, OLD))
    index = _index(tmp_path)
    try:
        _wait_current(index)
        index._disk.close()  # the listing stays as it is: what a lookup reads
        # Removed behind the index's back: only the listing (no stat) still says "disk".
        os.remove(_entry(tmp_path, "a" * 64))
        assert index.lookup("a" * 64, fresh=False) == "disk"
        assert index.lookup("b" * 64) is None
        # A fresh lookup (an item another instance is storing) checks the file.
        index.forget("a" * 64)
        assert index.lookup("a" * 64, fresh=True) is None
    finally:
        index.close()


def test_entry_written_elsewhere_is_found_then_listed(tmp_path):
    os.utime(tmp_path, ns=(OLD, OLD))
    index = _index(tmp_path)
    try:
        _wait_current(index)
        _entry(tmp_path, "c" * 64).write_bytes(b"frame")  # another process's write
        # Once the thread saw the directory change (within check_s), the entry is
        # stat-ed until the directory is listed again.
        deadline = time.monotonic() + 30
        while index.lookup("c" * 64) != "disk":
            assert time.monotonic() < deadline, "the entry was never found"
            time.sleep(0.005)
        os.utime(tmp_path, ns=(OLD + 1, OLD + 1))  # as if the change were long ago
        _wait_current(index)
        assert IDENTITY.storage_name("c" * 64) in index._disk.names
    finally:
        index.close()


def test_missing_directory_is_an_empty_listing_until_created(tmp_path):
    directory = tmp_path / "not-yet"
    index = _index(directory)
    try:
        _wait_current(index)
        assert index.lookup("d" * 64) is None
        directory.mkdir()
        _entry(directory, "d" * 64).write_bytes(b"frame")
        deadline = time.monotonic() + 30
        while index.lookup("d" * 64) != "disk":
            assert time.monotonic() < deadline, "the entry was never found"
            time.sleep(0.005)
    finally:
        index.close()
