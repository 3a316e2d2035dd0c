"""A tier that is not configured costs nothing at start-up.

Each check runs in a fresh interpreter, so nothing imported by other tests
can hide an import the engine made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BUILD = r"""
import json, sys
from lmcache_ec import ECCache
config = json.loads(sys.argv[1])
with ECCache.from_config(config, model="org/startup") as cache:
    tiers = cache.tiers
clients = sorted(
    name for name in sys.modules
    if name.split(".")[0] in ("redis", "boto3", "botocore", "aiobotocore", "s3transfer")
)
print(json.dumps({"tiers": tiers, "clients": clients}))
"""


def _build(config: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["LMCACHE_LOG_LEVEL"] = "WARNING"
    env = {k: v for k, v in env.items() if not k.startswith("LMCACHE_EC_")}  # no remote by env
    done = subprocess.run(
        [sys.executable, "-c", _BUILD, json.dumps(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_no_remote_imports_no_remote_client(tmp_path):
    result = _build(
        {
            "local_cpu": True,
            "max_local_cpu_size": 0.05,
            "local_disk": str(tmp_path),
            "max_local_disk_size": 0.05,
        }
    )
    assert result["tiers"] == ["cpu", "disk"]
    assert result["clients"] == [], f"built without a remote tier, yet imported {result['clients']}"


def test_cpu_only_imports_no_remote_client():
    result = _build({"local_cpu": True, "max_local_cpu_size": 0.05})
    assert result["tiers"] == ["cpu"]
    assert result["clients"] == [], f"built without a remote tier, yet imported {result['clients']}"
