"""Shared fixtures: small tiers in a temporary directory, deterministic tensors."""

from __future__ import annotations

import contextlib
import os
import tracemalloc

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

import pytest
import torch

from lmcache_ec import ECCache

__all__ = ["bit_equal", "make_tensor", "traced_peak"]

pytest_plugins = ["tests.servers"]


def traced_peak(call):
    """``call()``'s result and the most memory Python allocated during it (bytes)."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def make_tensor(shape: tuple[int, int], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN-safe, unlike torch.equal)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        # reshape(-1): a contiguous [n, 1] tensor may have a last stride other than 1
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


LEDGERS_BEFORE = pytest.StashKey[set[str]]()


def _ledger_dir() -> str:
    """Where directory tiers keep their size ledgers: this user's runtime
    directory, outside the tests' temporary directories."""
    from lmcache_ec.runtime_dirs import state_base, user_dir

    return os.path.join(user_dir(state_base()).path, "ledgers")


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    # The controller (or a lone pytest) notes the ledgers there before any test;
    # a worker of ``-n`` does not: it could end while another still writes.
    if not _is_xdist_worker(session.config):
        ledgers = _ledger_dir()
        before = set(os.listdir(ledgers)) if os.path.isdir(ledgers) else set()
        session.config.stash[LEDGERS_BEFORE] = before


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the ledgers this run made, once every worker is done."""
    before = session.config.stash.get(LEDGERS_BEFORE, None)
    if before is None:  # a worker
        return
    ledgers = _ledger_dir()
    if not os.path.isdir(ledgers):
        return
    for name in set(os.listdir(ledgers)) - before:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(ledgers, name))


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch, tmp_path):
    """No test reads the developer's LMCache config or writes their cache dir."""
    for name in list(os.environ):
        if name.startswith("LMCACHE_EC_") or name == "LMCACHE_CONFIG_FILE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def disk_dir(tmp_path):
    path = tmp_path / "ec-disk"
    path.mkdir(mode=0o700)  # as the tier makes it: a wider one is warned about
    return path


@pytest.fixture
def local_config(disk_dir):
    """CPU (64 MB) + disk (1 GB) tier config as a dict."""
    return {
        "local_cpu": True,
        "max_local_cpu_size": 0.0625,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 1.0,
    }


_IDENTITY = ("revision", "namespace", "fingerprint", "dtype", "weights")


@pytest.fixture
def make_cache(local_config):
    """``make_cache(config=None, *, model="m", **keys)``: an ``ECCache`` on ``config``
    (default: ``local_config``) with the config ``keys`` merged in; the identity's
    (``dtype``, ``namespace``, ``weights``...) go to ``from_config``. Every cache built
    is closed at teardown; a test that reopens a tier closes the first itself
    (``with make_cache() as writer:``)."""
    built: list[ECCache] = []

    def make(config=None, /, *, model: str = "m", **overrides) -> ECCache:
        identity = {key: overrides.pop(key) for key in _IDENTITY if key in overrides}
        if config is None or overrides:
            config = {**(local_config if config is None else config), **overrides}
        built.append(ECCache.from_config(config, model=model, **identity))
        return built[-1]

    yield make
    for cache in reversed(built):
        cache.close()


@pytest.fixture
def cache(make_cache):
    return make_cache(model="test/model")


@pytest.fixture(params=["redis", "s3"])
def remote(request) -> dict:
    """``remote_config`` kwargs (tests/remote/conftest.py) for a fresh, empty Redis or S3 remote."""
    if request.param == "redis":
        return {"url": request.getfixturevalue("redis_url")}
    bucket = request.getfixturevalue("s3_bucket")
    server = request.getfixturevalue("s3_server")
    return {"url": f"s3://{bucket}/ec-test", "endpoint": server.endpoint}


@pytest.fixture(scope="session")
def model_config():
    """vLLM's ModelConfig of the tiny BLIP-2 (tests/vllm/cpu_env.py sets vLLM's
    environment first), with the connector registered as vLLM's plugin loader does."""
    from vllm.config import ModelConfig

    from lmcache_ec.integration.vllm.plugin import register
    from tests.vllm.cpu_env import MODEL_DIR

    register()
    return ModelConfig(model=MODEL_DIR, tokenizer=MODEL_DIR, max_model_len=256, dtype="bfloat16")


@pytest.fixture
def extra(disk_dir):
    """ec_connector_extra_config of a small CPU + disk tier shared by two engines."""
    return {
        "lmcache_config": {
            "max_local_cpu_size": 0.01,
            "local_disk": str(disk_dir),
            "max_local_disk_size": 0.1,
        }
    }


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Real-server tests last: their session-wide ``vllm serve`` processes then never
    run beside the timing-sensitive fault tests."""
    items.sort(key=lambda item: item.nodeid.startswith("tests/e2e/"))  # stable: order kept
