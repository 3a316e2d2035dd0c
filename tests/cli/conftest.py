"""CLI fixtures: a config file on a temporary disk tier, and a runner."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from lmcache_ec import ECCache
from lmcache_ec.cli import app


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def invoke(runner):
    def run(*args: str, expect: int | None = 0):
        result = runner.invoke(app, [str(a) for a in args])
        if expect is not None:
            assert result.exit_code == expect, (result.exit_code, result.output, result.exception)
        return result

    return run


@pytest.fixture
def invoke_json(invoke):
    def run(*args: str, expect: int | None = 0):
        return json.loads(invoke(*args, "--json", expect=expect).stdout)

    return run


def write_config(path, **ec) -> str:
    path.write_text(yaml.safe_dump({"chunk_size": 256, "ec": ec}))
    return str(path)


def remote_config_file(tmp_path, disk_dir, url: str) -> str:
    """A config with a small CPU tier, ``disk_dir`` and ``url`` as the remote tier."""
    return write_config(
        tmp_path / "remote.yaml",
        local_cpu=True,
        max_local_cpu_size=0.0625,
        local_disk=str(disk_dir),
        max_local_disk_size=1.0,
        remote_url=url,
        remote_timeout=2.0,
    )


def config_without(tmp_path, disk_dir, redis_process, command: str) -> str:
    """``remote_config_file`` for a Redis user who may run every command but
    ``command`` (an ACL), on ``redis_process``."""
    redis_process.client().acl_setuser(
        "lister", enabled=True, passwords=["+pw"], keys="*", commands=["+@all", f"-{command}"]
    )
    url = f"redis://lister:pw@127.0.0.1:{redis_process.port}"
    return remote_config_file(tmp_path, disk_dir, url)


@pytest.fixture
def config_file(tmp_path, disk_dir):
    return write_config(
        tmp_path / "lmcache.yaml",
        local_cpu=True,
        max_local_cpu_size=0.0625,
        local_disk=str(disk_dir),
        max_local_disk_size=1.0,
    )


def populate(config: str, model: str, namespace: str, count: int, rows: int = 4) -> list[str]:
    """Store ``count`` small entries; returns their mm_hashes."""
    hashes = [f"{model}|{namespace}|image-{i}" for i in range(count)]
    with ECCache.from_config(config, model=model, namespace=namespace) as cache:
        for i, mm_hash in enumerate(hashes):
            assert cache.put(mm_hash, torch.full((rows, 8), float(i), dtype=torch.bfloat16))
    return hashes
