"""The ``ec:`` keys: each one's type, its one default, its check and its documentation.

``SCHEMA`` is the table every other place reads: ``config.load_config``
resolves and checks values against it, ``lmcache-ec config-doc`` and
docs/configuration.md are generated from it. Beside it: the LMCache
aliases accepted in ``ec:`` (``ALIASES``), the LMCache keys refused there
with the key that does their job (``REPLACED``), and the remote keys as
fields of ``RemoteSettings`` (``REMOTE_FIELDS``). Sizes are in the config's
GB; ``gb_to_bytes`` is the one conversion.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from .remote_names import check_s3_endpoint, check_s3_region, check_url

CACHE_POLICIES = ("LRU", "LFU", "FIFO", "MRU")

ADDRESSING_STYLES = ("path", "virtual", "auto")


@dataclass(frozen=True)
class Option:
    """One ``ec:`` key: its type, its one default, and how it is checked."""

    name: str
    _: KW_ONLY
    kind: str  # bool | int | float | str | list | dict
    default: Any
    help: str
    lmcache: bool  # passed through to LMCacheEngineConfig
    check: Callable[[Any], str | None] | None = None  # returns an error or None
    aliases: tuple[str, ...] = ()  # LMCache keys accepted in ``ec:`` for this one


def _not_finite(value: Any) -> bool:
    # Floats only: math.isfinite of an int past a float's range (400 digits) overflows.
    return isinstance(value, float) and not math.isfinite(value)


def _positive(value: Any) -> str | None:
    if _not_finite(value):
        return "must be a finite number"
    return None if value > 0 else "must be > 0"


def _non_negative(value: Any) -> str | None:
    if _not_finite(value):
        return "must be a finite number"
    return None if value >= 0 else "must be >= 0"


GB = 1024**3  # bytes in the config's "GB", as LMCache reads its own sizes
MAX_SIZE_GB = 1024**3  # 1 EiB: beyond any host, and bytes still fit in an int64
# One day: a longer wait is a typo, and a bound far past it (1e300) overflows
# the waits it becomes (threading's timeouts stop at threading.TIMEOUT_MAX).
MAX_SECONDS = 86400.0
MAX_READ_THREADS = 256  # threads one get_many batch may start; more is a typo


def gb_to_bytes(size_gb: float) -> int:
    """A size of the config (GB) in bytes: the one conversion."""
    return int(size_gb * GB)


def _size_gb(value: Any) -> str | None:
    problem = _positive(value)
    if problem is None and value > MAX_SIZE_GB:
        problem = f"must be at most {MAX_SIZE_GB} (GB)"
    if problem is None and gb_to_bytes(value) < 1:  # 1e-12: a tier of 0 bytes holds nothing
        problem = f"must be at least one byte ({1 / GB:.3g} GB)"
    return problem


def _at_most_a_day(value: Any) -> str | None:
    return None if value <= MAX_SECONDS else f"must be at most {MAX_SECONDS:g} (one day)"


def _seconds(value: Any) -> str | None:
    """A positive number of seconds, at most a day."""
    return _positive(value) or _at_most_a_day(value)


def _seconds_or_zero(value: Any) -> str | None:
    """A non-negative number of seconds, at most a day."""
    return _non_negative(value) or _at_most_a_day(value)


def _read_threads(value: Any) -> str | None:
    problem = _positive(value)  # an int: at least 1
    if problem is None and value > MAX_READ_THREADS:
        problem = f"must be at most {MAX_READ_THREADS}"
    return problem


def _non_empty(value: Any) -> str | None:
    return None if value else "must be a non-empty string"


def _path(value: Any) -> str | None:
    """A file system path: one with a NUL byte fails every call that takes it."""
    return "must not contain a NUL byte" if "\0" in value else None


def _non_empty_path(value: Any) -> str | None:
    return _non_empty(value) or _path(value)


def _cache_policy(value: Any) -> str | None:
    return None if value.upper() in CACHE_POLICIES else f"must be one of {CACHE_POLICIES}"


def _remote_url(value: Any) -> str | None:
    return None if value is None else check_url(value)


def _s3_endpoint(value: Any) -> str | None:
    return check_s3_endpoint(value) if value else None  # "": unset


def _s3_region(value: Any) -> str | None:
    return check_s3_region(value) if value else None  # "": unset


def _addressing_style(value: Any) -> str | None:
    return None if value in ADDRESSING_STYLES else f"must be one of {ADDRESSING_STYLES}"


def _naive_serde(value: Any) -> str | None:
    # Frames are bytes already; LMCache's other serializers compress KV tensors
    # (cachegen needs a KV model's config) and fail at the engine's start.
    return None if value == "naive" else "must be naive (entries are framed bytes)"


SCHEMA: dict[str, Option] = {
    opt.name: opt
    for opt in (
        Option(
            "local_cpu",
            kind="bool",
            default=True,
            help="Keep entries in the CPU tier. When false the CPU pool only "
            "stages disk and remote transfers.",
            lmcache=True,
        ),
        Option(
            "max_local_cpu_size",
            kind="float",
            default=1.0,
            help="CPU tier capacity in GB (also the largest entry stored, or read from the remote "
            "tier: a Redis read takes at most this many bytes), rounded down to whole 4 KiB "
            "allocation units. Memory is not reserved at start: a background thread makes "
            "pages resident a window (128 MB) ahead of use; with an accelerator the pool is "
            "page-locked, at its exact size, from the start.",
            lmcache=True,
            check=_size_gb,
        ),
        Option(
            "local_disk",
            kind="str",
            default=None,
            help="Directory of the disk tier (a path or file:// URL); unset disables the tier.",
            lmcache=True,
            check=_path,
        ),
        Option(
            "max_local_disk_size",
            kind="float",
            default=10.0,
            help="Disk tier capacity in GB; least recently used entries are removed beyond it.",
            lmcache=True,
            check=_size_gb,
        ),
        Option(
            "local_disk_group_shared",
            kind="bool",
            default=False,
            help="Share the disk tier with the members of its directory's group: a directory "
            "this process makes is 2770 (new files keep its group) and entries are 0660. "
            "Its size ledger is then kept in it (.ledger, 0660), so the limit holds across "
            "the group's users. A directory made private before keeps its mode and group "
            "(a WARNING at start) until its owner runs chgrp <group> and chmod 2770 on it. "
            "Off, it is 0700 and entries 0600: stored embeddings can reveal image content.",
            lmcache=False,
        ),
        # -- sharing a directory, and the node tier (tiers/budget.py, tiers/node.py)
        Option(
            "min_residency_s",
            kind="float",
            default=5.0,
            help="Seconds after its last use during which an entry of the disk or node tier "
            "is safe from other processes' evictions: a process over the directory's limit "
            "evicts its own entries first, then others' idle ones, else skips the write.",
            lmcache=False,
            check=_seconds_or_zero,
        ),
        Option(
            "cpu_huge_pages",
            kind="bool",
            default=False,
            help="Ask Linux for transparent huge pages on the CPU pool (where THP is 'madvise' or "
            "'always'): copies out of the pool take fewer TLB misses, but a first touch of "
            "pool memory may wait for the kernel to compact memory (ms on a fragmented host).",
            lmcache=False,
        ),
        Option(
            "node_tier",
            kind="bool",
            default=False,
            help="One host copy per node: entries live in shared memory (node_dir) for every "
            "process of this user and namespace; the CPU pool then only stages transfers.",
            lmcache=False,
        ),
        Option(
            "max_node_size",
            kind="float",
            default=4.0,
            help="Node tier capacity in GB, shared by every process on the node (LRU); "
            "never more than node_dir's file system has free.",
            lmcache=False,
            check=_size_gb,
        ),
        Option(
            "node_dir",
            kind="str",
            default="/dev/shm",
            help="Node-local directory (shared memory) under which this user's private runtime "
            "directory is made (mode 0700): the node tier's entries, the size ledgers of the "
            "disk and node tiers (but a group-shared disk directory's, kept in it), and the "
            "vLLM stage channel's sockets when $XDG_RUNTIME_DIR is unset or not this user's "
            "private directory. Give every process "
            "on the node the same.",
            lmcache=False,
            check=_non_empty_path,
        ),
        Option(
            "remote_url",
            kind="str",
            default=None,
            help="Remote tier shared by every instance: redis://[user:password@]host:port[/db], "
            "rediss://… (TLS), unix:///path.sock, redis-cluster://host1:port1,host2:port2 "
            "(Redis Cluster), redis-sentinel://host1:port1,…/service_name (Sentinel), or "
            "s3://bucket/prefix (any S3-compatible store; see s3_endpoint_url, credentials "
            "from the AWS environment/config chain). "
            "Reads fall through CPU -> disk -> remote; writes reach the remote asynchronously. "
            "Redis URL options that set timeouts or retries (socket_timeout=, retry_on_timeout= "
            "…) are refused: remote_timeout bounds them; so are a path other than /<db>, port "
            "0, a URL option a connection of its scheme does not take (ssl_* only with "
            "rediss://), and a whole-number option out of the range redis-py takes (db= below "
            "0, socket_read_size= below 1, max_connections= below 0, protocol= other than 2 or "
            "3).",
            lmcache=True,
            check=_remote_url,
        ),
        Option(
            "remote_timeout",
            kind="float",
            default=2.0,
            help="Upper bound in seconds for every remote operation (connect, lookup, read, "
            "write, delete); a slower or failing call is a miss and marks the remote tier "
            "unavailable until a health probe succeeds. In a Redis Cluster a shard that "
            "fails costs only its own keys. Alias: blocking_timeout_secs.",
            lmcache=False,
            check=_seconds,
            aliases=("blocking_timeout_secs",),
        ),
        Option(
            "remote_retry_interval",
            kind="float",
            default=1.0,
            help="Seconds between health probes while the remote tier is unavailable; "
            "lookups miss and writes stay local meanwhile; when a probe succeeds the "
            "tier reconnects and re-sends what was written locally in the meantime.",
            lmcache=False,
            check=_seconds,
        ),
        Option(
            "s3_endpoint_url",
            kind="str",
            default=None,
            help="S3 endpoint for s3:// remote_url, e.g. http://minio:9000 (no credentials: "
            "those are AWS credentials); unset uses AWS.",
            lmcache=False,
            check=_s3_endpoint,
        ),
        Option(
            "s3_region",
            kind="str",
            default=None,
            help="S3 region for s3:// remote_url; unset uses the AWS config chain.",
            lmcache=False,
            check=_s3_region,
        ),
        Option(
            "s3_addressing_style",
            kind="str",
            default=None,
            help="S3 addressing: path, virtual or auto; unset means path when "
            "s3_endpoint_url is set, else auto.",
            lmcache=False,
            check=_addressing_style,
        ),
        Option(
            "remote_serde",
            kind="str",
            default="naive",
            help="LMCache serializer for the remote tier; naive only (entries are framed bytes).",
            lmcache=True,
            check=_naive_serde,
        ),
        Option(
            "remote_storage_plugins",
            kind="list",
            default=None,
            help="LMCache remote storage plugins to load, beside or instead of remote_url.",
            lmcache=True,
        ),
        Option(
            "extra_config",
            kind="dict",
            default=None,
            help="LMCache extra_config mapping (plugin settings live here).",
            lmcache=True,
        ),
        Option(
            "cache_policy",
            kind="str",
            default="LRU",
            help="Eviction policy of the CPU tier. The disk and node tiers always evict the "
            "least recently used entries first (by file modification time).",
            lmcache=True,
            check=_cache_policy,
        ),
        Option(
            "namespace",
            kind="str",
            default="default",
            help="Tenant namespace: entries of different namespaces never meet. Taken as "
            "written in the YAML file (1.10 and 1.1 differ).",
            lmcache=False,
            check=_non_empty,
        ),
        Option(
            "weights_version",
            kind="str",
            default="",
            help="Version of the encoder weights, in every key: outputs of other weights never "
            "meet. Taken as written in the YAML file (1.10 and 1.1 differ). "
            "The vLLM connector adds a fingerprint of the loaded weights itself.",
            lmcache=False,
        ),
        Option(
            "purge_check_s",
            kind="float",
            default=2.0,
            help="Seconds between checks for a purge (lmcache-ec purge) by another process: a "
            "running engine stops serving purged entries from memory within this long after "
            "the purge (plus remote_timeout when the purge reached it only through the "
            "remote tier).",
            lmcache=False,
            check=_seconds,
        ),
        Option(
            "read_threads",
            kind="int",
            default=2,
            help="Threads that read one get_many batch below the CPU tier (the caller's "
            "included): disk and remote reads run side by side. CPU hits are copied on "
            "the caller's thread; 1 reads every item there.",
            lmcache=False,
            check=_read_threads,
        ),
        Option(
            "close_timeout",
            kind="float",
            default=30.0,
            help=(
                "The most seconds close() takes: waiting for accepted writes to reach "
                "every tier and stopping the tiers share this one bound."
            ),
            lmcache=False,
            check=_seconds_or_zero,
        ),
        Option(
            "timeline_path",
            kind="str",
            default=None,
            help="vLLM connector: append each multimodal request's timeline (arrival, first "
            "schedule, lookup, stage order, staged, scheduled with its load, load done) to "
            "this file as JSON lines, for lmcache-ec bench serve or a latency question; "
            "unset: nothing is recorded.",
            lmcache=False,
            check=_path,
        ),
    )
}

ALIASES: dict[str, str] = {alias: opt.name for opt in SCHEMA.values() for alias in opt.aliases}

# LMCache keys refused in ``ec:`` with the lmcache-ec key that does their job.
REPLACED: dict[str, str] = {
    "lookup_timeout_ms": "use remote_timeout (seconds; bounds every remote call)",
    "local_disk_path_sharding": "use local_disk (one directory for the encoder tier)",
    "gds_path": "use local_disk (the encoder tier has no GDS tier)",
    "storage_plugins": "use remote_storage_plugins (remote stores) or local_disk",
    "chunk_size": "has no meaning for encoder outputs: each entry is stored whole",
    "save_unfull_chunk": "has no meaning for encoder outputs: each entry is stored whole",
}

# The remote tier's options, as fields of ``RemoteSettings`` (``ECConfig.remote``).
REMOTE_FIELDS: dict[str, str] = {
    "remote_url": "url",
    "remote_timeout": "timeout",
    "remote_retry_interval": "retry_interval",
    "s3_endpoint_url": "s3_endpoint_url",
    "s3_region": "s3_region",
    "s3_addressing_style": "s3_addressing_style",
    "remote_serde": "serde",
    "remote_storage_plugins": "plugins",
}
