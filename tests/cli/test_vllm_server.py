"""The environment ``bench serve`` and the e2e fleet give each ``vllm serve`` they start
(no server is started: these hold on every vLLM version)."""

from __future__ import annotations

import os

import pytest


def test_servers_never_share_a_prometheus_directory(monkeypatch, tmp_path):
    """LMCache's PrometheusLogger sets PROMETHEUS_MULTIPROC_DIR process-wide; a
    server inheriting it would export the counters of every other server too."""
    from lmcache.observability import PrometheusLogger

    from lmcache_ec.bench.vllm_server import VLLMServer

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    PrometheusLogger._ensure_multiprocess_dir()  # what building one does
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"]
    server = VLLMServer(tmp_path / "model", tmp_path / "log")
    assert "PROMETHEUS_MULTIPROC_DIR" not in server.environment()


@pytest.mark.parametrize("user_root", [None, "own-vllm-root"])
def test_a_server_with_its_own_cache_home_keeps_vllms_cache_root(monkeypatch, tmp_path, user_root):
    """vLLM keeps model-inspection results under its cache root. ``bench serve`` and the
    e2e fleet move each server's XDG_CACHE_HOME; the servers must still use the
    caller's vLLM cache root, or every start inspects the model in one more process."""
    from vllm.envs import environment_variables

    from lmcache_ec.bench.vllm_server import VLLMServer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    if user_root is None:
        monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    else:
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / user_root))
    callers_root = environment_variables["VLLM_CACHE_ROOT"]()  # vLLM's own rule
    assert callers_root == str(tmp_path / (user_root or "user-cache/vllm"))

    server_xdg = str(tmp_path / "server-xdg")
    server = VLLMServer(tmp_path / "model", tmp_path / "log", env={"XDG_CACHE_HOME": server_xdg})
    env = server.environment()
    assert env["XDG_CACHE_HOME"] == server_xdg
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    monkeypatch.setenv("VLLM_CACHE_ROOT", env["VLLM_CACHE_ROOT"])
    assert environment_variables["VLLM_CACHE_ROOT"]() == callers_root

    # A server told where vLLM's cache root is keeps what it was told.
    pinned = VLLMServer(
        tmp_path / "model",
        tmp_path / "log",
        env={"XDG_CACHE_HOME": server_xdg, "VLLM_CACHE_ROOT": str(tmp_path / "pinned")},
    )
    assert pinned.environment()["VLLM_CACHE_ROOT"] == str(tmp_path / "pinned")
