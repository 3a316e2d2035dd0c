"""Another local user takes this user's runtime directory first.

The squatter makes ``<base>/lmcache-ec-<uid>`` (the name this user's
processes use for the node tier, the disk tiers' size ledgers and the stage
sockets) as uid 65534 before the engine starts. Nothing may be read or
written in it; the engine must start and serve:

- where this user can have a private alternative (a name only its own
  processes know), every feature works there and all its processes agree;
- where it cannot, only the feature that needed the directory is off, with
  one warning naming the path and its owner, a metric and a doctor line;
  disk writes still land.

The test runs as root (it makes a directory as another uid with ``chown``).
One test runs the engine at its default paths in a child process with a
private ``/dev/shm`` (a tmpfs in its own mount namespace), so nothing else
on the machine sees the squatted directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from lmcache_ec.cli.doctor import check_runtime_dirs
from lmcache_ec.config import load_config
from lmcache_ec.metrics_export import register
from lmcache_ec.runtime_dirs import token_path, user_dir
from tests.conftest import bit_equal, make_tensor

SQUATTER = 65534  # nobody

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the squatter's directory is made as uid 65534 (chown)"
)


def squat(path) -> None:
    """``path`` made by another user, open to everyone: a lure to write into."""
    os.mkdir(path)
    os.chmod(path, 0o777)
    os.chown(path, SQUATTER, SQUATTER)


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """A world-writable directory like /dev/shm, with this user's name in it
    taken; this user's home (where its token lives) under the test's directory."""
    base = tmp_path / "shm"
    base.mkdir()
    os.chmod(base, 0o1777)
    squat(base / f"lmcache-ec-{os.getuid()}")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return base


@pytest.fixture
def no_alternative(shared, tmp_path, monkeypatch):
    """As ``shared``, and no private alternative either: the home directory is
    not a directory, so no token can be kept."""
    not_a_home = tmp_path / "not-a-home"
    not_a_home.write_text("")
    monkeypatch.setenv("HOME", str(not_a_home))
    return shared


def _config(base, disk_dir, **more) -> dict:
    return {
        "local_cpu": True,
        "max_local_cpu_size": 0.0625,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 1.0,
        "node_dir": str(base),
        **more,
    }


def _taken(base):
    return base / f"lmcache-ec-{os.getuid()}"


def test_a_taken_directory_gives_way_to_one_only_this_user_knows(
    shared, disk_dir, caplog, make_cache
):
    with caplog.at_level(logging.WARNING):
        cache = make_cache(_config(shared, disk_dir, node_tier=True), model="m/squat")
    with cache:
        assert cache.tiers == ["node", "disk"]
        tensor = make_tensor((8, 64), torch.float16)
        assert cache.put("a", tensor)
        assert cache.contains("a") == "node" and bit_equal(cache.get("a"), tensor)
        node_dir = cache._storage.storage_backends["NodeBackend"].directory
        assert cache.stats.snapshot()["features_off"] == {}
    alternative = user_dir(str(shared)).path
    assert node_dir.startswith(alternative + os.sep)
    assert alternative != str(_taken(shared))
    assert os.stat(alternative).st_mode & 0o777 == 0o700
    assert os.stat(token_path()).st_mode & 0o777 == 0o600
    assert os.listdir(_taken(shared)) == []  # nothing read or written there
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert str(_taken(shared)) in warnings[0] and "uid 65534" in warnings[0]
    # Every process of this user finds the same directory.
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from lmcache_ec.runtime_dirs import user_dir\nprint(user_dir({str(shared)!r}).path)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert other.stdout.strip() == alternative
    statuses = {
        c.area: (c.status, c.message)
        for c in check_runtime_dirs(load_config(_config(shared, disk_dir, node_tier=True)))
    }
    assert statuses["node tier dir"][0] == "warn"
    assert (
        "uid 65534" in statuses["node tier dir"][1] and alternative in statuses["node tier dir"][1]
    )


def test_without_a_private_directory_the_node_tier_is_off_and_the_engine_serves(
    no_alternative, disk_dir, caplog, make_cache
):
    config = _config(no_alternative, disk_dir, node_tier=True)
    with caplog.at_level(logging.WARNING):
        cache = make_cache(config, model="m/no-node")
    with cache:
        assert cache.tiers == ["cpu", "disk"]
        tensors = {f"img-{i}": make_tensor((8, 64), torch.float16, seed=i) for i in range(3)}
        for name, tensor in tensors.items():
            assert cache.put(name, tensor)
        assert cache.flush(10)
        assert len(list(disk_dir.glob("*.pt"))) == 3
        for name, tensor in tensors.items():
            assert bit_equal(cache.get(name), tensor)
        assert cache.stats.snapshot()["features_off"] == {
            "node_tier": "directory_taken",
            "shared_ledger": "directory_taken",
        }
        registry = CollectorRegistry()
        register(cache, registry)
        page = generate_latest(registry).decode()
    assert (
        'lmcache_ec_feature_off{feature="node_tier",model="m/no-node",namespace="default",'
        'reason="directory_taken"} 1.0' in page
    )
    assert os.listdir(_taken(no_alternative)) == []
    node = [r.getMessage() for r in caplog.records if r.getMessage().startswith("node_tier off")]
    assert len(node) == 1, node
    assert str(_taken(no_alternative)) in node[0] and "uid 65534" in node[0]
    checks = {c.area: c for c in check_runtime_dirs(load_config(config))}
    assert (
        checks["node tier dir"].status == "fail" and "uid 65534" in checks["node tier dir"].message
    )
    assert checks["size ledgers"].status == "warn"
    assert checks["stage channel"].status == "warn"
    assert "weights_fingerprint" in checks["stage channel"].message


# -- the engine at its default paths, in a private /dev/shm -------------------------

_CHILD = textwrap.dedent(
    """
    import json, logging, os, sys
    taken = f"/dev/shm/lmcache-ec-{os.getuid()}"
    os.mkdir(taken); os.chmod(taken, 0o777); os.chown(taken, 65534, 65534)
    import torch
    from lmcache_ec import ECCache
    warnings = []
    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())
    logging.getLogger("lmcache_ec").addHandler(Keep())
    report = {}
    for name, node_tier in (("ledger", False), ("node", True)):
        disk = os.path.join(sys.argv[1], name)
        config = {"local_cpu": True, "max_local_cpu_size": 0.0625, "local_disk": disk,
                  "max_local_disk_size": 1.0, "node_tier": node_tier}
        try:
            with ECCache.from_config(config, model=f"m/{name}") as cache:
                tensor = torch.arange(512, dtype=torch.float16).reshape(8, 64)
                stored = [cache.put(f"img-{i}", tensor + i) for i in range(3)]
                cache.flush(10)
                snap = cache.stats.snapshot()
                report[name] = {
                    "tiers": cache.tiers, "stored": stored,
                    "files": len([f for f in os.listdir(disk) if f.endswith(".pt")]),
                    "write_errors": snap["tiers"]["disk"].get("write_errors", 0),
                    "features_off": snap.get("features_off"),
                }
        except Exception as exc:
            report[name] = {"error": repr(exc)}
    report["taken_listing"] = os.listdir(taken)
    report["warnings"] = warnings
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def default_paths_squatted(tmp_path_factory):
    """The child's report: two engines at default paths (node_dir /dev/shm, no
    $XDG_RUNTIME_DIR, no home of its own) after /dev/shm/lmcache-ec-<uid> was taken."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) not found: it gives the child a private /dev/shm")
    root = tmp_path_factory.mktemp("default-paths")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env.update(HOME=str(root / "no-home"), PYTHONPATH=os.getcwd(), LMCACHE_LOG_LEVEL="ERROR")
    (root / "no-home").write_text("")  # no token can be kept: no private alternative
    script = 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"'
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            sys.executable,
            "-c",
            _CHILD,
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_disk_writes_land_when_the_ledger_directory_is_taken(default_paths_squatted):
    ledger = default_paths_squatted["ledger"]
    assert "error" not in ledger, ledger
    assert ledger["stored"] == [True] * 3
    assert ledger["files"] == 3 and ledger["write_errors"] == 0
    assert ledger["features_off"] == {"shared_ledger": "directory_taken"}
    said = [w for w in default_paths_squatted["warnings"] if w.startswith("shared_ledger off")]
    assert len(said) == 1 and "/dev/shm/lmcache-ec-0 belongs to uid 65534" in said[0]
    assert default_paths_squatted["taken_listing"] == []


def test_the_engine_starts_without_the_node_tier_at_default_paths(default_paths_squatted):
    node = default_paths_squatted["node"]
    assert "error" not in node, node
    assert node["tiers"] == ["cpu", "disk"] and node["files"] == 3
    assert node["features_off"] == {
        "node_tier": "directory_taken",
        "shared_ledger": "directory_taken",
    }
    said = [w for w in default_paths_squatted["warnings"] if w.startswith("node_tier off")]
    assert len(said) == 1 and "/dev/shm/lmcache-ec-0 belongs to uid 65534" in said[0]
