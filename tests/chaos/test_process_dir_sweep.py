"""Killed engines leave no growing pile of process directories.

Where no shared ledger directory can be had (``node_dir`` full, a squatter),
each process keeps its ledgers in ``$TMPDIR/lmcache-ec-<uid>-process-…``,
removed at a clean exit. A process killed (SIGKILL, the OOM killer) cannot
remove its own; the next process of the user that makes one removes those of
dead processes, so a crash-looping engine leaves at most the directories of
the processes still alive. A live process's directory, another user's, and a
symlink under such a name are never touched.

The other user's directory is made as uid 65534 with ``chown`` (as root).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SQUATTER = 65534  # nobody

# Makes its process directory, says where, then dies as asked.
_CHILD = """
import os, sys
from lmcache_ec.runtime_dirs import process_dir
print(process_dir(), flush=True)
if sys.argv[1] == "killed":
    os.kill(os.getpid(), 9)
elif sys.argv[1] == "lives":
    sys.stdin.read()  # until the test closes its stdin
elif sys.argv[1] == "forks, then killed":  # its child (a worker) outlives it
    if os.fork() == 0:
        sys.stdin.read()
        os._exit(0)
    os.kill(os.getpid(), 9)
"""


def _start(tmpdir, how: str) -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": os.getcwd()},
    )
    path = child.stdout.readline().strip()
    assert os.path.basename(path).startswith(f"lmcache-ec-{os.getuid()}-process-{child.pid}-")
    return child, path


def _run(tmpdir, how: str) -> str:
    child, path = _start(tmpdir, how)
    child.communicate(timeout=60)
    return path


def _process_dirs(tmpdir) -> set[str]:
    prefix = f"lmcache-ec-{os.getuid()}-process-"
    return {str(tmpdir / name) for name in os.listdir(tmpdir) if name.startswith(prefix)}


def test_a_killed_process_directory_is_removed_by_the_next_process_and_a_live_one_is_kept(
    tmp_path,
):
    for _ in range(3):  # a crash loop: each killed engine's directory is all that is left
        killed = _run(tmp_path, "killed")
        assert _process_dirs(tmp_path) == {killed}  # nothing ran at its exit
    live, live_path = _start(tmp_path, "lives")
    try:
        assert _process_dirs(tmp_path) == {live_path}
        later = _run(tmp_path, "exits")  # a clean exit removes its own
        assert later != live_path and _process_dirs(tmp_path) == {live_path}
        assert os.path.isdir(live_path)  # still its process's
    finally:
        live.communicate(timeout=60)
    assert live.returncode == 0 and _process_dirs(tmp_path) == set()


def test_a_forked_child_that_outlives_its_parent_does_not_keep_the_parents_directory(
    tmp_path,
):
    parent, path = _start(tmp_path, "forks, then killed")
    try:
        parent.wait(timeout=60)
        assert _process_dirs(tmp_path) == {path}
        later = _run(tmp_path, "exits")  # while the child still runs
        assert not os.path.exists(path) and not os.path.exists(later)
    finally:
        parent.stdin.close()  # the child reads its end of file and exits


def test_the_sweep_leaves_another_users_directory_a_symlink_and_an_older_one(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("makes a directory as another uid with chown")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    prefix = f"lmcache-ec-{os.getuid()}-process-"
    elsewhere = tmp_path / "elsewhere"
    os.rename(_run(tmpdir, "killed"), elsewhere)  # a dead process's directory, moved out
    os.symlink(elsewhere, tmpdir / f"{prefix}1-link")
    theirs = tmpdir / f"{prefix}2-theirs"  # another user's, with an unlocked lock file
    theirs.mkdir()
    (theirs / ".alive").write_text("")
    for path in (theirs / ".alive", theirs):
        os.chown(path, SQUATTER, SQUATTER)
    older = tmpdir / f"{prefix}old"  # made before process directories had a lock file
    older.mkdir(mode=0o700)
    (older / "ledger").write_text("")
    dead = _run(tmpdir, "killed")  # the one to remove: the sweep ran
    _run(tmpdir, "exits")
    assert _process_dirs(tmpdir) == {str(p) for p in (tmpdir / f"{prefix}1-link", theirs, older)}
    assert not os.path.exists(dead)
    assert os.path.islink(tmpdir / f"{prefix}1-link") and os.listdir(elsewhere) == [".alive"]
    assert os.listdir(theirs) == [".alive"] and os.listdir(older) == ["ledger"]
