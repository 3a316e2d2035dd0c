"""The one place that maps remote URL schemes to stores.

Config validation asks ``check_url`` (pure parsing, no client library is
imported); ``open_store`` imports the store's module (and so redis or boto3)
only when such a remote is configured.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from .naming import parse_node_list, parse_s3_url, scheme_of

if TYPE_CHECKING:
    from .settings import RemoteSettings
    from .store import RemoteStore


@dataclass(frozen=True)
class StoreKind:
    schemes: tuple[str, ...]
    module: str  # imported on open only
    factory: str  # ``module.factory(settings) -> RemoteStore``
    check: Callable[[str], None]  # raises ValueError for a malformed URL
    example: str


def _check_redis(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme.lower() == "unix":
        if not parsed.path:
            raise ValueError("expected unix:///path/to/redis.sock")
        return
    if not parsed.hostname:
        raise ValueError("expected redis://[user:password@]host:port[/db]")
    _ = parsed.port  # ValueError for a bad port


def _check_cluster(url: str) -> None:
    parse_node_list(url, service=False)


def _check_sentinel(url: str) -> None:
    parse_node_list(url, service=True)


def _check_s3(url: str) -> None:
    parse_s3_url(url)


STORES: tuple[StoreKind, ...] = (
    StoreKind(
        ("redis", "rediss", "unix"),
        "lmcache_ec.remote.redis_store",
        "open_redis",
        _check_redis,
        "redis://[user:password@]host:port[/db]",
    ),
    StoreKind(
        ("redis-cluster",),
        "lmcache_ec.remote.redis_store",
        "open_redis_cluster",
        _check_cluster,
        "redis-cluster://[user:password@]host1:port1[,host2:port2,…]",
    ),
    StoreKind(
        ("redis-sentinel",),
        "lmcache_ec.remote.redis_store",
        "open_redis_sentinel",
        _check_sentinel,
        "redis-sentinel://[user:password@]host1:port1[,…]/service_name",
    ),
    StoreKind(
        ("s3",),
        "lmcache_ec.remote.s3_store",
        "open_s3",
        _check_s3,
        "s3://bucket/prefix",
    ),
)

# Schemes LMCache knows whose connectors size reads from the KV chunk shape
# and so would return garbage for encoder tensors.
REFUSED: dict[str, str] = {
    "resp": "the resp:// client allocates the KV chunk shape on read",
    "valkey": "the Valkey connector allocates the KV chunk shape on read",
}


def store_kind(url: str) -> StoreKind | None:
    scheme = scheme_of(url)
    return next((kind for kind in STORES if scheme in kind.schemes), None)


def supported_schemes() -> list[str]:
    return [scheme for kind in STORES for scheme in kind.schemes]


def check_url(url: str) -> str | None:
    """Why ``url`` cannot be a remote tier, or None if it can."""
    try:
        scheme = urlparse(url).scheme.lower()
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        return f"is not a valid URL: {exc}"
    if not scheme:
        return "must be a URL such as redis://host:6379"
    if scheme in REFUSED:
        return f"scheme {scheme}:// is refused: {REFUSED[scheme]}"
    kind = store_kind(url)
    if kind is None:
        supported = ", ".join(f"{name}://" for name in supported_schemes())
        return (
            f"scheme {scheme}:// is not supported for encoder outputs (supported: {supported}); "
            "other LMCache stores can be added as remote_storage_plugins"
        )
    try:
        kind.check(url)
    except ValueError as exc:
        return f"{exc} (expected {kind.example})"
    return None


def open_store(settings: RemoteSettings) -> RemoteStore:
    """The store of ``settings.url``; does not contact the server.

    ``ValueError`` for a URL ``check_url`` refuses.
    """
    problem = check_url(settings.url)
    kind = store_kind(settings.url)
    if problem is not None or kind is None:
        raise ValueError(f"remote_url {problem}")
    factory = getattr(importlib.import_module(kind.module), kind.factory)
    return factory(settings)
