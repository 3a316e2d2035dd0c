"""The directory layout: which file is an entry, a write in progress, or neither."""

from __future__ import annotations

import os

import pytest
import torch

from lmcache_ec.key import EncoderIdentity
from lmcache_ec.purge.marker import log_name
from lmcache_ec.tiers.disk_layout import (
    TEMP_PREFIX,
    DirectoryLayout,
    entry_stem,
    is_temp,
    temp_owner,
    temp_reserved,
)


def _name(model: str) -> str:
    return EncoderIdentity(model=model, dtype="bfloat16").key("image").storage_name


@pytest.mark.parametrize("model", ["/tmp/models/x", "tmp-model", ".tmp-1-2", "org/vlm.pt"])
def test_entry_and_temp_names_never_meet(tmp_path, model):
    layout = DirectoryLayout(str(tmp_path))
    name = _name(model)
    entry = os.path.basename(layout.path_of(name))
    temp = os.path.basename(layout.temp_path(name))
    assert entry_stem(entry) == name and not is_temp(entry)
    assert is_temp(temp) and entry_stem(temp) is None
    assert temp_owner(temp) == os.getpid() and temp_reserved(temp) == 0
    reserved = os.path.basename(layout.temp_path(name, 4096))
    assert is_temp(reserved) and entry_stem(reserved) is None
    assert temp_owner(reserved) == os.getpid() and temp_reserved(reserved) == 4096


def test_scan_lists_entries_only_and_counts_live_writes(tmp_path):
    layout = DirectoryLayout(str(tmp_path))
    name = _name("/tmp/models/x")
    assert layout.write(name, torch.zeros(100, dtype=torch.uint8).numpy())
    assert not layout.write(name, torch.ones(100, dtype=torch.uint8).numpy())  # kept as is
    (tmp_path / log_name("default")).write_text("{}")
    (tmp_path / f"{TEMP_PREFIX}{os.getpid()}-9.{name}").write_bytes(b"x" * 10)
    (tmp_path / "notes.txt").write_text("kept")
    scan = layout.scan()
    assert [e.name for e in scan.entries] == [name]
    assert scan.temp_bytes == 10 and scan.total == 110
    assert (tmp_path / layout.path_of(name)).read_bytes() == bytes(100)


def test_scan_counts_a_write_at_its_reservation_and_a_published_one_once(tmp_path):
    layout = DirectoryLayout(str(tmp_path))
    name, other = _name("/tmp/models/x"), _name("/tmp/models/y")
    temp = layout.create_temp(name, 1000)
    assert layout.scan().temp_bytes == 1000  # reserved, nothing written yet
    (tmp_path / os.path.basename(temp)).write_bytes(b"x" * 600)
    assert layout.scan().total == 1000
    # Between link and the temp's removal one file has two names.
    published = layout.create_temp(other, 100)
    (tmp_path / os.path.basename(published)).write_bytes(b"y" * 100)
    os.link(published, layout.path_of(other))
    scan = layout.scan()
    assert [e.name for e in scan.entries] == [other]
    assert scan.temp_bytes == 1000 and scan.total == 1100


def _scan_after(layout: DirectoryLayout, between) -> object:
    """``layout.scan()`` over a listing taken before ``between()`` ran: what a
    scan sees when other processes act between its listing and its ``stat``s."""
    listed = list(DirectoryLayout._items(layout))
    between()
    layout._items = lambda: iter(listed)  # type: ignore[method-assign]
    return layout.scan()


def test_a_write_published_between_listing_and_stat_counts_at_its_reservation(tmp_path):
    layout = DirectoryLayout(str(tmp_path))
    name = _name("/tmp/models/x")
    temp = layout.create_temp(name, 1000)
    # Listed as a temp file, published and its temp name gone before its stat:
    # its entry is not in the listing either.
    scan = _scan_after(layout, lambda: layout.write(name, bytes(1000), temp=temp))
    assert scan.entries == [] and scan.total == 1000
    assert DirectoryLayout(str(tmp_path)).scan().total == 1000  # the truth, listed again


def test_a_write_listed_under_both_names_counts_once_when_its_temp_name_goes(tmp_path):
    layout = DirectoryLayout(str(tmp_path))
    name = _name("/tmp/models/x")
    temp = layout.create_temp(name, 1000)
    (tmp_path / os.path.basename(temp)).write_bytes(bytes(1000))
    os.link(temp, layout.path_of(name))  # listed with both names, then the temp goes
    scan = _scan_after(layout, lambda: os.remove(temp))
    assert [e.name for e in scan.entries] == [name] and scan.total == 1000


@pytest.mark.parametrize("bad", ["../escape", "a/b", ".hidden", "nul\0byte"])
def test_names_that_leave_the_directory_are_refused(tmp_path, bad):
    with pytest.raises(ValueError):
        DirectoryLayout(str(tmp_path)).path_of(bad)
