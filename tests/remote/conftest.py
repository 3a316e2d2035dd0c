"""Configs for the remote-tier tests: small tiers, real servers; short timeouts only
where a test measures how an outage is bounded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from redis.connection import AbstractConnection

from lmcache_ec.config import load_config
from lmcache_ec.remote.redis_store import PACKER
from lmcache_ec.remote.store import open_store

TIMEOUT = 0.5  # remote_timeout of the outage tests, which bound calls by it
RETRY = 0.2  # remote_retry_interval used by the fault tests
# A healthy server on a loaded 2-core machine can take longer than TIMEOUT to
# answer (moto's S3 has); a test about behaviour, not outages, must never
# see its store marked unavailable for that.
SERVING_TIMEOUT = 5.0


def remote_config(url: str, *, endpoint: str | None = None, **extra) -> dict:
    """An ``ec:`` section with a 16 MB CPU tier, no disk, and ``url`` as remote."""
    config = {
        "max_local_cpu_size": 1 / 64,
        "remote_url": url,
        "remote_timeout": SERVING_TIMEOUT,
        "remote_retry_interval": RETRY,
        "close_timeout": 5,
    }
    if endpoint:
        config["s3_endpoint_url"] = endpoint
    config.update(extra)
    return config


def open_stores(url: str, endpoint: str | None = None, count: int = 2) -> list:
    """``count`` store clients of one remote, as ``count`` instances would hold."""
    settings = load_config(remote_config(url, endpoint=endpoint)).remote
    return [open_store(settings) for _ in range(count)]


def outage_config(url: str, *, endpoint: str | None = None, **extra) -> dict:
    """``remote_config`` with the short ``TIMEOUT``, for tests that bound outages."""
    return remote_config(url, endpoint=endpoint, **{"remote_timeout": TIMEOUT, **extra})


@contextlib.contextmanager
def frames_sent_in_place() -> Iterator[list[int]]:
    """Sizes of the values handed to Redis as memoryviews (frames sent from the
    pool buffer, no copy) by redis-py's own packer inside the block."""
    sizes: list[int] = []
    pack = PACKER.pack

    def recording_pack(*args):
        sizes.extend(len(arg) for arg in args if isinstance(arg, memoryview))
        return pack(*args)

    PACKER.pack = recording_pack
    try:
        yield sizes
    finally:
        del PACKER.pack


@contextlib.contextmanager
def redis_requests() -> Iterator[list[bytes]]:
    """The requests redis-py sent inside the block, from every client and thread,
    each as the bytes it wrote before reading replies: one round trip each (a
    pipeline is one request)."""
    sent: list[bytes] = []
    send = AbstractConnection.send_packed_command

    def recording_send(self, command, check_health=True):
        parts = [command] if isinstance(command, (str, bytes, memoryview)) else command
        sent.append(b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts))
        return send(self, command, check_health)

    AbstractConnection.send_packed_command = recording_send
    try:
        yield sent
    finally:
        AbstractConnection.send_packed_command = send
