"""This user's runtime directories: where each feature's state goes (runtime_dirs.py).

What happens when another user takes one first: tests/chaos/test_runtime_dirs.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from lmcache_ec.runtime_dirs import (
    SOCKET_PATH_MAX,
    find_user_dir,
    socket_dir,
    socket_path,
    state_base,
    user_dir,
)


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
        assert os.path.basename(short) == "engine-a-dp1-tp0.sock"
    finally:
        shutil.rmtree(root)


def test_ledgers_and_sockets_leave_an_unwritable_node_dir_for_the_temp_directory(tmp_path):
    assert state_base(str(tmp_path)) == str(tmp_path)
    assert state_base(str(tmp_path / "missing")) == tempfile.gettempdir()
