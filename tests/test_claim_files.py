"""Claim files that are not what they seem, and claims shared by a group.

- A FIFO, a symlink (to a FIFO or to a live claim elsewhere) or a socket
  named like a claim in a claims directory is garbage: a claim on its name is
  made at once (taken over as an expired one), a release leaves it, and the
  sweep removes it — nothing ever opens it for reading in a way that waits on
  a writer or follows the link.
- A disk directory whose parent cannot be written keeps its claims inside
  it (``.claims``), shared by every instance, never listed as entries.
- ``group_shared`` (``local_disk_group_shared``): two users of one group
  share claims (directory 2770, files 0660): the second is told the first
  holds an item, and takes over its expired claims. Without it, a user who
  cannot write another's claims directory works on every item anyway and
  says so in one warning, not one per claim.

The two users are real uids (65533 and 65534 in a group of their own), in
child processes that drop to them after their imports (the venv lives under
root's 0700 home), so these tests need root.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
import torch

from lmcache_ec.claims import DirectoryClaims, _read, claims_dir_for
from lmcache_ec.config import load_config
from lmcache_ec.purge.inventory import scan_disk
from lmcache_ec.storage.single_flight import claim_store_factory

JOIN_S = 10.0  # a claim still running after this waits on something it must not


def made_within_bound(claims: DirectoryClaims, name: str) -> bool:
    """``claims.claim(name, 60)``, failing the test if it does not return in time."""
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: answers.append(claims.claim(name, 60)), daemon=True)
    thread.start()
    thread.join(JOIN_S)
    assert not thread.is_alive(), f"claiming {name!r} waits on a file that is not a claim"
    return answers[0]


def test_a_fifo_named_like_a_claim_is_taken_over_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "item.claim")
    first = DirectoryClaims(str(tmp_path))
    first._next_sweep = float("inf")  # the claim itself meets the FIFO, not the sweep
    assert made_within_bound(first, "item")
    assert stat.S_ISREG(os.lstat(tmp_path / "item.claim").st_mode)  # a real claim now
    assert not made_within_bound(DirectoryClaims(str(tmp_path)), "item")


def test_a_symlink_named_like_a_claim_is_garbage_and_its_target_untouched(tmp_path):
    directory, elsewhere = tmp_path / "claims", tmp_path / "elsewhere"
    directory.mkdir()
    elsewhere.mkdir()
    os.mkfifo(elsewhere / "fifo")
    live = elsewhere / "live.claim"
    record = json.dumps({"owner": "someone", "expires": time.time() + 600})
    live.write_text(record)
    os.symlink(elsewhere / "fifo", directory / "to-fifo.claim")
    os.symlink(live, directory / "to-live.claim")
    claims = DirectoryClaims(str(directory))
    claims._next_sweep = float("inf")
    assert _read(str(directory / "to-live.claim")) == ("", 0.0)  # not followed
    assert made_within_bound(claims, "to-fifo")
    assert made_within_bound(claims, "to-live")
    assert live.read_text() == record and stat.S_ISFIFO(os.stat(elsewhere / "fifo").st_mode)


def test_a_release_leaves_a_fifo_alone_at_once(tmp_path):
    os.mkfifo(tmp_path / "item.claim")
    claims = DirectoryClaims(str(tmp_path))
    thread = threading.Thread(target=claims.release, args=("item",), daemon=True)
    thread.start()
    thread.join(JOIN_S)
    assert not thread.is_alive(), "the release waits on a FIFO's writer"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "item.claim").st_mode)


def test_the_sweep_removes_fifos_symlinks_and_sockets_named_like_claims(tmp_path):
    directory = tmp_path / "claims"
    directory.mkdir()
    os.mkfifo(directory / "fifo.claim")
    os.mkfifo(tmp_path / "target")
    os.symlink(tmp_path / "target", directory / "link.claim")
    os.symlink(tmp_path / "target", directory / "link.claim.0123.tmp")
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(directory / "socket.claim"))
    # A store's first claim sweeps the directory (every instance's does).
    assert made_within_bound(DirectoryClaims(str(directory)), "fresh")
    assert sorted(os.listdir(directory)) == ["fresh.claim", "link.claim.0123.tmp"]  # a new .tmp
    assert stat.S_ISFIFO(os.stat(tmp_path / "target").st_mode)


_AS_USER = textwrap.dedent(
    """
    import json, logging, os, sys
    from lmcache_ec.claims import DirectoryClaims
    uid, gid, directory, shared = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    os.umask(0o022)  # a usual umask: it must not take the group's bits
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    handler.setLevel(logging.WARNING)
    logging.getLogger("lmcache_ec").addHandler(handler)
    claims = DirectoryClaims(directory, group_shared=shared == "shared")
    answers = {}
    for order in sys.argv[5:]:
        name, ttl = order.split("=")
        answers[name] = claims.claim(name, float(ttl))
    print(json.dumps({"answers": answers, "warnings": warnings}))
    """
)

USER_A, USER_B, GROUP = 65533, 65534, 65533

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: children switch uids")


def as_user(uid: int, directory: str, shared: bool, *orders: str) -> dict:
    """Claims made by ``uid`` (in GROUP only): ``orders`` are ``name=ttl``."""
    mode = "shared" if shared else "private"
    done = subprocess.run(
        [sys.executable, "-c", _AS_USER, str(uid), str(GROUP), directory, mode, *orders],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.fixture
def group_dir():
    """A directory of GROUP (setgid), as a group-shared disk tier's parent is."""
    base = tempfile.mkdtemp(prefix="ec-claims-group-")
    os.chown(base, 0, GROUP)
    os.chmod(base, 0o2770)
    yield base
    shutil.rmtree(base)


@needs_root
def test_users_of_a_group_share_claims(group_dir):
    directory = os.path.join(group_dir, "disk.claims")
    first = as_user(USER_A, directory, True, "item=600", "dead=0")
    assert first == {"answers": {"item": True, "dead": True}, "warnings": []}
    second = as_user(USER_B, directory, True, "item=600", "dead=600", "new=600")
    # Told the first holds "item"; takes over its expired claim; makes its own.
    assert second == {"answers": {"item": False, "dead": True, "new": True}, "warnings": []}
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o2770
    for name in ("item", "dead", "new"):
        info = os.stat(os.path.join(directory, name + ".claim"))
        assert stat.S_IMODE(info.st_mode) == 0o660 and info.st_gid == GROUP
    assert _read(os.path.join(directory, "dead.claim"))[1] > time.time() + 500  # second's now


@needs_root
def test_claims_another_user_cannot_make_are_one_warning_not_one_per_claim(group_dir):
    directory = os.path.join(group_dir, "disk.claims")
    assert as_user(USER_A, directory, False, "item=600")["answers"] == {"item": True}
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    second = as_user(USER_B, directory, False, "item=600", "other=600")
    assert second["answers"] == {"item": True, "other": True}  # works on them anyway
    assert len(second["warnings"]) == 1 and directory in second["warnings"][0]


@pytest.mark.parametrize("group_shared", [False, True])
def test_the_caches_claims_follow_the_disk_tiers_group_sharing(tmp_path, group_shared):
    disk = tmp_path / "disk"
    config = load_config({"local_disk": str(disk), "local_disk_group_shared": group_shared})
    store = claim_store_factory(config)()
    assert store.claim("item", 600)
    directory = claims_dir_for(str(disk))
    assert stat.S_IMODE(os.stat(directory).st_mode) == (0o2770 if group_shared else 0o700)
    mode = stat.S_IMODE(os.stat(os.path.join(directory, "item.claim")).st_mode)
    assert mode == (0o660 if group_shared else 0o600)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def test_claims_go_inside_the_disk_directory_where_its_parent_cannot_be_written(
    tmp_path, make_cache
):
    """A disk directory made for a service in a parent it cannot write
    (``/var/cache/lmcache-ec`` chowned to it): claims beside it cannot be made,
    so they are kept inside it, and instances still share them (every one
    encoded each item, once claims were off). The parent is a read-only bind
    mount, the disk directory a writable tmpfs in it."""
    parent = tmp_path / "var-cache"
    disk = parent / "lmcache-ec"
    disk.mkdir(parents=True)
    _mount("--bind", str(parent), str(parent))
    try:
        _mount("-o", "remount,bind,ro", str(parent))
        _mount("-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk))
        try:
            config = load_config({"local_disk": str(disk)})
            first, second = (claim_store_factory(config)() for _ in range(2))
            assert first.claim("item", 600)
            assert not second.claim("item", 600)  # they share one claims directory
            assert os.path.isfile(disk / ".claims" / "item.claim")
            cache = make_cache({"local_disk": str(disk), "max_local_cpu_size": 0.05})
            assert cache.put("img", torch.ones(4, 8))
            assert cache.flush(10)
            assert [e.name for e in os.scandir(disk) if not e.name.startswith(".")] == [
                cache.key("img").storage_name + ".pt"
            ]
            cache.close()
            assert [e.name for e in scan_disk(str(disk))] == [cache.key("img").storage_name]
        finally:
            subprocess.run(["umount", str(disk)], check=False)
    finally:
        subprocess.run(["umount", str(parent)], check=False)
