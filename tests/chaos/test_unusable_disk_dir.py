"""Directories another user owns, or that this user cannot list, at start.

A child process imports everything as root, then becomes uid 65534 (nobody)
for good, and as that user:

- starts an engine whose ``local_disk`` is root's 0700 directory: it starts
  on its CPU tier, with one warning naming the directory and the reason, and
  ``disk_tier`` in ``features_off``;
- starts an engine whose node-tier directory is its own but cannot be listed
  (mode 0300): it starts without the node tier, the same way;
- runs ``lmcache-ec ls`` and ``stats`` on the first config: the disk tier is
  skipped with a warning, exit 1, no traceback.

The venv lives under root's 0700 home, so the child cannot be started as
nobody (``setpriv``): it drops to nobody after its imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from lmcache_ec.key import slug

NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the child switches to uid 65534"
)

_CHILD = textwrap.dedent(
    """
    import json, logging, os, sys
    import torch
    from typer.testing import CliRunner
    from lmcache_ec import ECCache
    from lmcache_ec.cli import app

    tree = sys.argv[1]
    def config(**more):
        return {"local_cpu": True, "max_local_cpu_size": 0.0625,
                "max_local_disk_size": 1.0, "node_dir": os.path.join(tree, "shm"), **more}
    warnings = []
    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())
    logging.getLogger("lmcache_ec").addHandler(Keep())
    runner = CliRunner()

    # Every lazy import, as root: nobody cannot read the venv.
    with ECCache.from_config(config(local_disk=os.path.join(tree, "root-warmup")), model="w"):
        pass
    runner.invoke(app, ["ls", "--config", os.path.join(tree, "warmup.yaml")])
    os.setgroups([]); os.setgid(65534); os.setuid(65534)

    def engine(cfg):
        warnings.clear()
        try:
            with ECCache.from_config(cfg, model="m/nobody") as cache:
                tensor = torch.arange(512, dtype=torch.float16).reshape(8, 64)
                stored = cache.put("img", tensor)
                cache.flush(10)
                got = cache.get("img")
                return {"tiers": cache.tiers, "stored": stored,
                        "served": got is not None and torch.equal(got, tensor),
                        "features_off": cache.stats.snapshot()["features_off"],
                        "warnings": list(warnings)}
        except Exception as exc:
            return {"error": repr(exc)}

    def cli(*args):
        result = runner.invoke(app, list(args))
        return {"exit_code": result.exit_code, "exception": repr(result.exception),
                "output": " ".join(result.output.split())}

    report = {
        "others_disk": engine(config(local_disk=os.path.join(tree, "root-only"))),
        "unlistable_node": engine(config(local_disk=os.path.join(tree, "nobody-disk"),
                                         node_tier=True)),
        "ls": cli("ls", "--config", os.path.join(tree, "others.yaml")),
        "stats": cli("stats", "--config", os.path.join(tree, "others.yaml")),
    }
    print(json.dumps(report))
    """
)


def _own(path: str, mode: int, uid: int = NOBODY) -> str:
    os.makedirs(path, exist_ok=True)
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return path


@pytest.fixture(scope="module")
def as_nobody() -> dict:
    """The child's report (see the module's docstring)."""
    tree = tempfile.mkdtemp(prefix="lmcache-ec-another-user-")
    try:
        os.chmod(tree, 0o755)  # nobody may reach what is inside, not change it
        os.chmod(_own(os.path.join(tree, "shm"), 0o1777, 0), 0o1777)  # like /dev/shm
        _own(os.path.join(tree, "root-only"), 0o700, 0)
        _own(os.path.join(tree, "nobody-disk"), 0o700)
        user = _own(os.path.join(tree, "shm", f"lmcache-ec-{NOBODY}"), 0o700)
        node = _own(os.path.join(user, "node"), 0o700)
        _own(os.path.join(node, slug("default")), 0o300)  # its own, but not listable
        for name, disk in (("warmup", "root-warmup"), ("others", "root-only")):
            with open(os.path.join(tree, f"{name}.yaml"), "w") as stream:
                stream.write(f"ec:\n  local_disk: {os.path.join(tree, disk)}\n")
        env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
        env.update(
            HOME=os.path.join(tree, "no-home"),
            PYTHONPATH=os.getcwd(),
            LMCACHE_LOG_LEVEL="ERROR",
        )
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, tree],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
            cwd=tree,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def test_the_engine_starts_without_a_disk_directory_of_another_user(as_nobody):
    started = as_nobody["others_disk"]
    assert "error" not in started, started
    assert started["tiers"] == ["cpu"]
    assert started["stored"] and started["served"]
    assert started["features_off"] == {"disk_tier": "directory_unusable"}
    said = started["warnings"]
    assert len(said) == 1, said
    assert said[0].startswith("disk_tier off")
    assert "root-only: Permission denied" in said[0]


def test_the_engine_starts_without_a_node_directory_it_cannot_list(as_nobody):
    started = as_nobody["unlistable_node"]
    assert "error" not in started, started
    assert started["tiers"] == ["cpu", "disk"]
    assert started["stored"] and started["served"]
    assert started["features_off"] == {"node_tier": "directory_unusable"}
    said = started["warnings"]
    assert len(said) == 1, said
    assert said[0].startswith("node_tier off")
    assert f"{slug('default')}: Permission denied" in said[0]


@pytest.mark.parametrize("command", ["ls", "stats"])
def test_the_cli_skips_a_disk_directory_of_another_user(as_nobody, command):
    ran = as_nobody[command]
    assert ran["exit_code"] == 1 and ran["exception"] == "SystemExit(1)", ran
    said = "".join(ran["output"].split())  # a long path may wrap anywhere
    assert "disktierskipped" in said
    assert "root-only:Permissiondenied" in said
