"""Remote passwords never reach the logs, including LMCache's own INFO lines."""

from __future__ import annotations

import logging

import torch

from tests.remote.conftest import remote_config
from tests.servers import REDIS_PASSWORD

LMCACHE_LOGGERS = (
    "lmcache.v1.storage_backend.remote_backend",
    "lmcache.v1.storage_backend.connector",
    "lmcache.v1.storage_backend.connector.redis_adapter",
    "lmcache_ec.remote.backend",
)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_password_is_redacted_in_every_log_line(redis_server_auth, make_cache):
    capture = _Capture()
    levels = {}
    for name in LMCACHE_LOGGERS:
        logger = logging.getLogger(name)
        levels[name] = logger.level
        logger.setLevel(logging.DEBUG)  # setLevel: also resets logging's enabled-cache
        logger.addHandler(capture)
    try:
        url = redis_server_auth.url
        assert REDIS_PASSWORD in url
        with make_cache(remote_config(url)) as cache:
            assert cache.put("a", torch.ones(2, 2))
            assert cache.flush(10)
        bad = remote_config(url.replace(REDIS_PASSWORD, REDIS_PASSWORD + "-wrong"))
        with make_cache(bad) as cache:
            assert cache.get("a") is None
    finally:
        for name in LMCACHE_LOGGERS:
            logging.getLogger(name).removeHandler(capture)
            logging.getLogger(name).setLevel(levels[name])
    assert any("***" in line for line in capture.lines)  # the URLs were logged, redacted
    assert not [line for line in capture.lines if REDIS_PASSWORD in line]
