"""Where an entry lives in each remote store, and what a remote URL names.

One naming, used by every store (``remote/redis_store``, ``remote/redis_cluster``,
``remote/s3_store``) and so by both the serving path and ``RemoteCatalog``:

- Redis (standalone, Cluster, Sentinel): two keys per entry, as LMCache's own
  ``RedisConnector`` writes them: ``<storage_name>kv_bytes`` (the frame) and
  ``<storage_name>metadata`` (LMCache's ``RemoteMetadata``: length, shape,
  dtype, format). The frame is the entry: existence checks look at it.
- S3: one object per entry, ``<prefix>/<storage_name>``, holding the frame;
  its size is the frame length.
- A claim (an encode in flight, ``claims.py``) for an entry lives beside it,
  never at its key: ``<storage_name>.claim`` (Redis key, S3 object). It is
  not a storage name, so listings and purges never see it.

A remote URL names a store: ``STORES`` is the one map from URL scheme to
store, ``check_url`` why a URL cannot be a remote tier (config validation
asks it), ``redact`` the URL as it may be shown. Pure string handling: no
client library is imported here; ``remote.store.open_store`` imports a
store's module only when such a remote is configured.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import ParseResult, parse_qs, urlparse

REDIS_DATA_SUFFIX = "kv_bytes"
REDIS_META_SUFFIX = "metadata"
S3_SCHEME = "s3"


def redis_data_key(storage_name: str) -> str:
    return storage_name + REDIS_DATA_SUFFIX


def redis_meta_key(storage_name: str) -> str:
    return storage_name + REDIS_META_SUFFIX


CLAIM_SUFFIX = ".claim"


def claim_key(name: str) -> str:
    """Where the claim on ``name`` lives: beside the entry, never at its key."""
    return name + CLAIM_SUFFIX


def scheme_of(url: str | None) -> str:
    return urlparse(url).scheme.lower() if url else ""


def redact(url: str | None) -> str:
    """``url`` with any password replaced by ``***``."""
    if not url or "@" not in url:
        return url or ""
    head, _, tail = url.rpartition("@")
    scheme, sep, auth = head.partition("://")
    user = auth.split(":", 1)[0] if ":" in auth else auth
    return f"{scheme}{sep}{user}:***@{tail}" if ":" in auth else url


_URL_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.-]*://)([^/@\s:]*):([^/@\s]*)@", re.IGNORECASE)


def redact_text(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` replaced by ``***``."""
    return _URL_CREDENTIALS.sub(r"\1\2:***@", text)


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix``: the bucket and the key prefix (no slashes at the ends)."""

    bucket: str
    prefix: str = ""

    def object_key(self, storage_name: str) -> str:
        return f"{self.prefix}/{storage_name}" if self.prefix else storage_name

    def storage_name(self, object_key: str) -> str | None:
        """The storage name of an object key under this prefix, else None."""
        head = f"{self.prefix}/" if self.prefix else ""
        if not object_key.startswith(head):
            return None
        name = object_key[len(head) :]
        return name if name and "/" not in name else None


def parse_s3_url(url: str) -> S3Location:
    """``s3://bucket[/prefix]`` -> ``S3Location``; ``ValueError`` if malformed."""
    parsed = urlparse(url)
    if parsed.scheme.lower() != S3_SCHEME:
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket = parsed.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise ValueError(
            "expected s3://bucket/prefix (put the endpoint in s3_endpoint_url "
            "and credentials in the AWS environment or config files)"
        )
    if parsed.query or parsed.fragment:
        raise ValueError("s3:// URLs take no query or fragment; use the s3_* options")
    return S3Location(bucket=bucket, prefix=parsed.path.strip("/"))


@dataclass(frozen=True)
class NodeList:
    """``scheme://[user[:password]@]host1:port1[,host2:port2…][/service]``.

    LMCache's spelling of Redis Cluster (``redis-cluster://``) and Sentinel
    (``redis-sentinel://…/service_name``) URLs.
    """

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    service: str = ""  # Sentinel: the monitored master's name


def parse_node_list(url: str, *, service: bool) -> NodeList:
    """Parse a node-list URL; ``service``: the path names a Sentinel master.

    ``ValueError`` naming what is wrong if malformed.
    """
    _, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a URL: {url!r}")
    auth, _, location = rest.rpartition("@")
    hosts, _, path = location.partition("/")
    username, password = None, None
    if auth:
        user, has_password, secret = auth.partition(":")
        username, password = user or None, secret if has_password else None
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        parsed = urlparse(f"//{part.strip()}")
        try:
            port = parsed.port
        except ValueError as exc:
            raise ValueError(f"node {part!r}: {exc}") from None
        if not parsed.hostname or not port:  # port 0: no server listens there
            raise ValueError(f"node {part!r} must be host:port (a port of 1-65535)")
        nodes.append((parsed.hostname, port))
    name = path.strip("/")
    if "?" in location or "#" in location:
        raise ValueError("node-list URLs take no query or fragment")
    if service and not name:
        raise ValueError("expected …/service_name after the sentinel nodes")
    if not service and name:
        raise ValueError("a cluster URL names nodes only (no /path)")
    return NodeList(tuple(nodes), username, password, name)


# -- which store a URL names


@dataclass(frozen=True)
class StoreKind:
    schemes: tuple[str, ...]
    module: str  # imported on open only
    factory: str  # ``module.factory(settings) -> RemoteStore``
    check: Callable[[str], object]  # raises ValueError for a malformed URL
    example: str


# redis-py's URL options that would replace the client's timeouts and retries:
# from_url lets them win over the options remote_timeout sets.
_REDIS_TIMING_OPTIONS = ("socket_timeout", "socket_connect_timeout", "timeout")
# URL options redis-py parses as whole numbers (a bad one fails only at open).
_REDIS_INT_OPTIONS = (
    "db",
    "socket_read_size",
    "max_connections",
    "health_check_interval",
    "ssl_min_version",
    "protocol",
)
# Their ranges, where redis-py refuses others only at connect (the tier would
# be down for good): least and greatest value (None: no greatest).
_REDIS_INT_RANGES: dict[str, tuple[int, int | None]] = {
    "db": (0, None),
    "socket_read_size": (1, None),
    "max_connections": (0, None),  # 0: no limit
    "protocol": (2, 3),
}
# The other URL options a connection takes (redis-py's URL_QUERY_ARGUMENT_PARSERS
# and its string options): redis-py hands any name to the connection's
# constructor, where one it does not take fails every connect (TypeError).
# Left out: decode_responses and encoding, which would turn frames into text.
_REDIS_OPTIONS = frozenset(
    {
        "db",
        "socket_read_size",
        "max_connections",
        "health_check_interval",
        "protocol",
        "legacy_responses",
        "client_name",
        "username",
        "password",
    }
)
_REDIS_TCP_OPTIONS = frozenset({"socket_keepalive"})  # not unix://
_REDIS_TLS_OPTIONS = frozenset(  # rediss:// only
    {
        "ssl_min_version",
        "ssl_check_hostname",
        "ssl_include_verify_flags",
        "ssl_exclude_verify_flags",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_password",
        "ssl_ciphers",
    }
)
_SSL_CERT_REQS = ("none", "optional", "required")
_DB_PATH = re.compile(r"/[0-9]+")  # redis-py reads any other path as db 0, or joins digits


def _check_redis(url: str) -> None:
    written = url.split(":", 1)[0]  # the scheme as written (unix:/path has no //)
    if written != written.lower():  # redis-py takes only redis://, rediss://, unix://
        raise ValueError(f"scheme {written}:// must be written in lower case")
    parsed = urlparse(url)
    if "@" in parsed.path + parsed.query + parsed.fragment:  # never repeat any of it
        raise ValueError(
            "has an '@' after the host (a password holding '/', '?' or '#' must be percent-encoded)"
        )
    scheme = parsed.scheme.lower()
    if scheme == "unix":
        if not parsed.path:
            raise ValueError("expected unix:///path/to/redis.sock")
    elif not parsed.hostname:
        raise ValueError("expected redis://[user:password@]host:port[/db]")
    else:
        if _port_of(parsed) == 0:  # redis-py takes port 0 for 6379
            raise ValueError("port 0 is no port (use 1-65535, or leave it out for 6379)")
        _check_db_path(parsed)
    _check_redis_options(parsed.query, scheme)


def _check_db_path(parsed: ParseResult) -> None:
    """The path of a redis:// URL: none, or one database number."""
    if parsed.path in ("", "/"):
        return
    if not _DB_PATH.fullmatch(parsed.path):
        raise ValueError("the path after host:port must be a database number such as /0")
    if "db" in parse_qs(parsed.query):
        raise ValueError("names its database twice: in the path and as db=; keep one")


def _port_of(parsed: ParseResult) -> int | None:
    """The URL's port; a ValueError that never repeats what stood there: with a
    '/', '?' or '#' in a password, what the parser takes for the port is the password."""
    try:
        return parsed.port
    except ValueError as exc:
        if str(exc).startswith("Port out of range"):  # holds no text of the URL's
            raise
        if "@" not in parsed.geturl():  # no password anywhere: the parser's words are clear
            raise
        raise ValueError(
            "has no valid port (a password holding '/', '?' or '#' must be percent-encoded)"
        ) from None


def _check_redis_options(query: str, scheme: str) -> None:
    """Refuse URL options that override ``remote_timeout``, that a ``scheme``
    connection does not take, or that redis-py cannot parse."""
    taken = _REDIS_OPTIONS | (_REDIS_TCP_OPTIONS if scheme != "unix" else frozenset())
    taken |= _REDIS_TLS_OPTIONS if scheme == "rediss" else frozenset()
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if name in _REDIS_TIMING_OPTIONS or name.startswith("retry"):
            raise ValueError(
                f"the URL option {name}= is refused: remote_timeout bounds every Redis "
                "call (connect, read, retries); set remote_timeout instead"
            )
        if name not in taken:
            raise ValueError(
                f"the URL option {name}= is not taken for {scheme}:// "
                f"(taken: {', '.join(sorted(taken))})"
            )
        value = values[0]
        if name in _REDIS_INT_OPTIONS and value and not value.strip().lstrip("+-").isdecimal():
            raise ValueError(f"the URL option {name}={value!r} is not a whole number")
        if name in _REDIS_INT_RANGES and value:
            _check_range(name, int(value), *_REDIS_INT_RANGES[name])
        if name == "ssl_cert_reqs" and value and value not in _SSL_CERT_REQS:
            raise ValueError(f"the URL option ssl_cert_reqs= must be one of {_SSL_CERT_REQS}")


def _check_range(name: str, value: int, least: int, greatest: int | None) -> None:
    if value < least or (greatest is not None and value > greatest):
        allowed = f"{least} to {greatest}" if greatest is not None else f"{least} or more"
        raise ValueError(f"the URL option {name}={value} is out of range ({allowed})")


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
        "lmcache_ec.remote.redis_cluster",
        "open_redis_cluster",
        functools.partial(parse_node_list, service=False),
        "redis-cluster://[user:password@]host1:port1[,host2:port2,…]",
    ),
    StoreKind(
        ("redis-sentinel",),
        "lmcache_ec.remote.redis_store",
        "open_redis_sentinel",
        functools.partial(parse_node_list, service=True),
        "redis-sentinel://[user:password@]host1:port1[,…]/service_name",
    ),
    StoreKind(
        ("s3",),
        "lmcache_ec.remote.s3_store",
        "open_s3",
        parse_s3_url,
        "s3://bucket/prefix",
    ),
)

# Schemes LMCache knows whose connectors size reads from the KV chunk shape
# and so would return garbage for encoder tensors.
REFUSED: dict[str, str] = {
    "resp": "the resp:// client allocates the KV chunk shape on read",
    "valkey": "the Valkey connector allocates the KV chunk shape on read",
}


# A DNS name or IPv4 address as botocore takes it (no "_", no spaces).
_HOST = re.compile(r"^((?!-)[a-z\d-]{1,63}(?<!-)\.)*((?!-)[a-z\d-]{1,63}(?<!-))\.?$", re.I)
# An AWS region name as botocore takes it: a DNS label, not only digits.
_REGION = re.compile(r"^(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)$")


def check_s3_endpoint(url: str) -> str | None:
    """Why ``url`` cannot be an S3 endpoint (``s3_endpoint_url``), or None if it can."""
    try:
        parsed = urlparse(url)
        _port_of(parsed)
    except ValueError as exc:
        return f"is not a valid URL: {exc}"
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return "must be an http:// or https:// URL such as http://minio:9000"
    if any(c.isspace() for c in url):
        return "must not contain white space"
    if parsed.username is not None or parsed.password is not None:
        # botocore signs with the AWS credentials, never the URL's; a password
        # there would only reach every log line that names the endpoint.
        return "must not hold credentials: give them as AWS credentials (environment, profile)"
    host = parsed.hostname
    if ":" not in host and not _HOST.match(host):  # ":": an IPv6 address
        return f"has an invalid host name {host!r}"
    return None


def check_s3_region(region: str) -> str | None:
    """Why ``region`` cannot be an AWS region name (``s3_region``), or None if it can."""
    return None if _REGION.match(region) else "must be a region name such as us-east-1"


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
