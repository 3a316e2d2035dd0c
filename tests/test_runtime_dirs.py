"""This user's runtime directories: where each feature's state goes (runtime_dirs.py).

What happens when another user takes one first: tests/chaos/test_runtime_dirs.py;
here, that a name another user learnt and took (the token's directory is listed
in the shared base, and a reboot empties it) gives way to a fresh token that
all of this user's processes agree on; and where numba's cache goes when its
own cannot be made.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from lmcache_ec import runtime_dirs
from lmcache_ec.runtime_dirs import (
    SOCKET_PATH_MAX,
    TOKEN_FILE,
    find_user_dir,
    socket_dir,
    socket_path,
    state_base,
    token_path,
    user_dir,
)

SQUATTER = 65534  # nobody


def test_the_user_dir_is_made_private_and_found_again(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert find_user_dir(str(tmp_path)) is None  # looking makes nothing
    assert os.listdir(tmp_path) == []
    made = user_dir(str(tmp_path))
    assert made.path == str(tmp_path / f"lmcache-ec-{os.getuid()}") and made.taken is None
    assert os.stat(made.path).st_mode & 0o777 == 0o700
    assert find_user_dir(str(tmp_path)) == made.path
    assert not (tmp_path / "home").exists()  # no token unless a name is taken


def test_sockets_prefer_a_private_xdg_runtime_dir(tmp_path, monkeypatch):
    xdg = tmp_path / "run-user"
    xdg.mkdir(mode=0o700)
    base = tmp_path / "shm"
    base.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert socket_dir(str(base)) == str(xdg / f"lmcache-ec-{os.getuid()}")
    os.chmod(xdg, 0o777)  # anyone may enter: not the login manager's private directory
    assert socket_dir(str(base)) == user_dir(str(base)).path
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert socket_dir(str(base)) == user_dir(str(base)).path


def test_a_socket_path_fits_a_unix_socket_and_names_its_engine(monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    root = tempfile.mkdtemp()  # short: pytest's tmp_path could not hold even a digest
    try:
        base = os.path.join(root, "x" * 20)
        os.mkdir(base)
        engines = [f"{'e' * 60}-{i}" for i in range(2)]  # the same first 64 characters
        paths = {socket_path(engine, 0, 3, base) for engine in engines}
        assert len(paths) == 2  # still one socket per engine
        for path in paths:
            assert len(os.fsencode(path)) <= SOCKET_PATH_MAX and path.endswith("-dp0-tp3.sock")
        short = socket_path("engine-a", 1, 0, base)
        assert re.fullmatch(r"engine-a-[0-9a-f]{16}-dp1-tp0\.sock", os.path.basename(short))
    finally:
        shutil.rmtree(root)


def test_ledgers_and_sockets_leave_an_unwritable_node_dir_for_the_temp_directory(tmp_path):
    assert state_base(str(tmp_path)) == str(tmp_path)
    assert state_base(str(tmp_path / "missing")) == tempfile.gettempdir()


# -- a token whose name another user took -------------------------------------------


def squat(path) -> None:
    """``path`` taken by another local user: a directory of uid 65534 where this
    test may ``chown``, else a file (this user can use neither)."""
    if os.geteuid() == 0:
        os.mkdir(path)
        os.chmod(path, 0o777)
        os.chown(path, SQUATTER, SQUATTER)
    else:
        path.write_text("")


def _shared_base(tmp_path, monkeypatch):
    """A world-writable base like /dev/shm whose plain name another user holds;
    this user's home under the test's directory."""
    base = tmp_path / "shm"
    base.mkdir()
    os.chmod(base, 0o1777)
    squat(base / f"lmcache-ec-{os.getuid()}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return base


def _token() -> str:
    with open(token_path()) as stream:
        return stream.read().strip()


def _is_untouched(path) -> bool:
    return os.listdir(path) == [] if path.is_dir() else path.read_text() == ""


def test_a_token_whose_name_another_user_took_is_replaced_and_found_by_later_processes(
    tmp_path, monkeypatch, caplog
):
    base = _shared_base(tmp_path, monkeypatch)
    seen = user_dir(str(base)).path  # the name anyone can list in the base
    shutil.rmtree(seen)  # a reboot empties the tmpfs, and the other user is first
    squat(base / os.path.basename(seen))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lmcache_ec.runtime_dirs"):
        fresh = user_dir(str(base))
    plain = str(base / f"lmcache-ec-{os.getuid()}")
    assert fresh.path != seen and fresh.path == f"{plain}-{_token()}"
    assert fresh.taken is not None and fresh.taken.path == plain
    assert os.stat(fresh.path).st_mode & 0o777 == 0o700
    assert os.stat(token_path()).st_mode & 0o777 == 0o600
    assert _is_untouched(base / os.path.basename(seen))  # nothing read or written there
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert seen in warnings[0] and "a new token was made" in warnings[0]
    assert fresh.path in warnings[0]
    assert find_user_dir(str(base)) == fresh.path
    later = subprocess.run(
        [sys.executable, "-c", _PRINT_USER_DIR, str(base), ""],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert later.stdout.strip() == fresh.path


def test_a_token_replaced_on_another_node_leaves_this_nodes_processes_in_their_directory(
    tmp_path, monkeypatch
):
    here = _shared_base(tmp_path, monkeypatch)  # one home, two nodes' /dev/shm
    there = tmp_path / "other-node-shm"
    there.mkdir()
    os.chmod(there, 0o1777)
    squat(there / f"lmcache-ec-{os.getuid()}")
    in_use = user_dir(str(here)).path  # this node's processes are in it
    squat(there / os.path.basename(in_use))  # the other node's squatter knew the name
    replaced = user_dir(str(there)).path
    assert os.path.basename(replaced) != os.path.basename(in_use)
    assert replaced.endswith(_token())
    # A process started here now still joins the others here.
    assert user_dir(str(here)).path == in_use and find_user_dir(str(here)) == in_use
    assert sorted(os.listdir(here)) == sorted(
        [f"lmcache-ec-{os.getuid()}", os.path.basename(in_use)]
    )


_PRINT_USER_DIR = """
import os, sys, time
from lmcache_ec.runtime_dirs import user_dir
go, deadline = sys.argv[2], time.monotonic() + 30
if go:  # ready; then all start at once
    open(f"{go}.{os.getpid()}", "w").close()
while go and not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.001)
print(user_dir(sys.argv[1]).path)
"""


def _wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_processes_replacing_a_taken_token_at_once_agree_on_one_directory(tmp_path, monkeypatch):
    base = _shared_base(tmp_path, monkeypatch)
    stale = "0123456789abcdef"  # known to the other user, who took its name
    token_file = tmp_path.joinpath("home", *TOKEN_FILE)
    token_file.parent.mkdir(parents=True)
    token_file.write_text(stale)
    os.chmod(token_file, 0o600)
    squat(base / f"lmcache-ec-{os.getuid()}-{stale}")
    go = tmp_path / "go"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _PRINT_USER_DIR, str(base), str(go)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        for _ in range(6)
    ]
    _wait_for(lambda: all(os.path.exists(f"{go}.{p.pid}") for p in processes))
    go.write_text("")
    paths = {process.communicate(timeout=60)[0].strip() for process in processes}
    assert all(process.returncode == 0 for process in processes)
    agreed = f"lmcache-ec-{os.getuid()}-{_token()}"
    assert _token() != stale and paths == {str(base / agreed)}
    # The others' fresh tokens went unused: no private directory was made for one.
    names = {f"lmcache-ec-{os.getuid()}", f"lmcache-ec-{os.getuid()}-{stale}", agreed}
    assert set(os.listdir(base)) == names


# -- numba's cache (LMCache compiles numba kernels when imported) ---------------


def test_numba_caches_in_the_process_dir_where_its_user_cache_cannot_be_made(tmp_path, monkeypatch):
    """A home nobody can write (``HOME=/`` of an arbitrary container uid): the
    import of LMCache would fail on its numba kernels."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked / "cache"))  # under a file: never made
    runtime_dirs.numba_cache_where_needed()
    assert os.environ["NUMBA_CACHE_DIR"] == os.path.join(runtime_dirs.process_dir(), "numba")


def test_numba_keeps_its_own_cache_where_it_can_make_it(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-yet" / "cache"))
    runtime_dirs.numba_cache_where_needed()
    assert "NUMBA_CACHE_DIR" not in os.environ
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "chosen"))
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-cache-here")
    runtime_dirs.numba_cache_where_needed()
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "chosen")  # the user's choice
