"""The ``ec:`` section of the LMCache YAML file: schema, sources, validation.

Sources, lowest precedence first:

1. the schema defaults below;
2. the ``ec:`` mapping of the YAML file (and top-level ``ec_<key>`` entries,
   LMCache 0.5.6's flat spelling of the same keys) — or, with no file at all,
   the embedded default (CPU tier + a disk tier under the user's cache dir);
3. ``LMCACHE_EC_<KEY>`` environment variables.

Top-level keys of the file are the KV cache's and are not inherited: the two
caches are sized independently, and the KV defaults (a 5 GB CPU pool) would
be wrong for encoder outputs.

Inside ``ec:`` the keys are LMCache's own (``local_cpu``, ``max_local_cpu_size``
in GB, ``local_disk``, ``max_local_disk_size`` in GB, ``remote_url`` …) plus
lmcache-ec's additions. Unknown keys and invalid values raise ``ConfigError``
naming the key and where it came from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

import platformdirs
import yaml

# Pure parsing and a dataclass: no client library, and remote/ never imports config.
from .remote.registry import check_url
from .remote.settings import RemoteSettings

ENV_PREFIX = "LMCACHE_EC_"
CONFIG_FILE_ENV = "LMCACHE_CONFIG_FILE"
FILE_PREFIX = "ec_"
CACHE_POLICIES = ("LRU", "LFU", "FIFO", "MRU")

ADDRESSING_STYLES = ("path", "virtual", "auto")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


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


def _positive(value: Any) -> str | None:
    if not math.isfinite(value):
        return "must be a finite number"
    return None if value > 0 else "must be > 0"


def _non_negative(value: Any) -> str | None:
    if not math.isfinite(value):
        return "must be a finite number"
    return None if value >= 0 else "must be >= 0"


GB = 1024**3  # bytes in the config's "GB", as LMCache reads its own sizes
MAX_SIZE_GB = 1024**3  # 1 EiB: beyond any host, and bytes still fit in an int64


def gb_to_bytes(size_gb: float) -> int:
    """A size of the config (GB) in bytes: the one conversion."""
    return int(size_gb * GB)


def _size_gb(value: Any) -> str | None:
    problem = _positive(value)
    if problem is None and value > MAX_SIZE_GB:
        problem = f"must be at most {MAX_SIZE_GB} (GB)"
    return problem


def _non_empty(value: Any) -> str | None:
    return None if value else "must be a non-empty string"


def _cache_policy(value: Any) -> str | None:
    return None if value.upper() in CACHE_POLICIES else f"must be one of {CACHE_POLICIES}"


def _remote_url(value: Any) -> str | None:
    return None if value is None else check_url(value)


def _addressing_style(value: Any) -> str | None:
    return None if value in ADDRESSING_STYLES else f"must be one of {ADDRESSING_STYLES}"


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
            "tier: a Redis read takes at most this many bytes). "
            "Memory is not reserved at start: a background thread makes pages resident a "
            "window (128 MB) ahead of use.",
            lmcache=True,
            check=_size_gb,
        ),
        Option(
            "local_disk",
            kind="str",
            default=None,
            help="Directory of the disk tier (a path or file:// URL); unset disables the tier.",
            lmcache=True,
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
            check=_non_negative,
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
            "disk and node tiers, and the vLLM stage channel's sockets when $XDG_RUNTIME_DIR "
            "is unset. Give every process on the node the same.",
            lmcache=False,
            check=_non_empty,
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
            "Reads fall through CPU -> disk -> remote; writes reach the remote asynchronously.",
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
            check=_positive,
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
            check=_positive,
        ),
        Option(
            "s3_endpoint_url",
            kind="str",
            default=None,
            help="S3 endpoint for s3:// remote_url, e.g. http://minio:9000; unset uses AWS.",
            lmcache=False,
        ),
        Option(
            "s3_region",
            kind="str",
            default=None,
            help="S3 region for s3:// remote_url; unset uses the AWS config chain.",
            lmcache=False,
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
            help="LMCache serializer for the remote tier (frames are already bytes: keep naive).",
            lmcache=True,
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
            help="Eviction policy of the CPU and disk tiers.",
            lmcache=True,
            check=_cache_policy,
        ),
        Option(
            "namespace",
            kind="str",
            default="default",
            help="Tenant namespace: entries of different namespaces never meet.",
            lmcache=False,
            check=_non_empty,
        ),
        Option(
            "weights_version",
            kind="str",
            default="",
            help="Version of the encoder weights, in every key: outputs of other weights never "
            "meet. The vLLM connector adds a fingerprint of the loaded weights itself.",
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
            check=_positive,
        ),
        Option(
            "read_threads",
            kind="int",
            default=2,
            help="Threads that read one get_many batch below the CPU tier (the caller's "
            "included): disk and remote reads run side by side. CPU hits are copied on "
            "the caller's thread; 1 reads every item there.",
            lmcache=False,
            check=_positive,  # an int: at least 1
        ),
        Option(
            "close_timeout",
            kind="float",
            default=30.0,
            help="Seconds close() waits for accepted writes to reach every tier.",
            lmcache=False,
            check=_non_negative,
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
        ),
    )
}


def default_disk_dir() -> str:
    return str(Path(platformdirs.user_cache_dir("lmcache-ec")) / "store")


def embedded_default() -> dict[str, Any]:
    """The tier used when no config file is given: the schema's CPU tier plus a
    disk tier under the user's cache directory (sizes: the schema's defaults)."""
    return {"local_disk": default_disk_dir()}


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(opt: Option, value: Any, origin: str) -> Any:
    """Convert ``value`` to the option's type; strings come from env/YAML."""
    where = f"{origin}: "
    if value is None:
        return None
    try:
        if opt.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
                return value.strip().lower() in _TRUE
            raise ValueError("expected true or false")
        if opt.kind in ("int", "float"):
            if isinstance(value, bool):
                raise ValueError("expected a number")
            number = float(value) if opt.kind == "float" else int(value)
            if opt.kind == "int" and isinstance(value, float) and value != int(value):
                raise ValueError("expected a whole number")
            return number
        if opt.kind == "str":
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError("expected a string")
            return str(value)
        if opt.kind == "list":
            if isinstance(value, str):
                value = [part.strip() for part in value.split(",") if part.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError("expected a list of strings")
            return value
        if opt.kind == "dict":
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, dict):
                raise ValueError("expected a mapping")
            return dict(value)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{where}invalid value {value!r:.80}: {exc}") from None
    raise AssertionError(opt.kind)


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

_EXTRA_KEY = "lmcache_ec.config"  # where ``to_lmcache`` puts the typed config


@dataclass(frozen=True)
class ECConfig:
    """Validated settings of the encoder tier, built once by ``load_config``.

    One typed field per ``ec:`` option (the remote tier's are grouped in
    ``remote``); sizes as configured in GB, and in bytes as ``*_bytes``.
    """

    local_cpu: bool
    max_local_cpu_size: float  # GB
    cpu_huge_pages: bool
    local_disk: str | None  # an absolute directory; None: no disk tier
    max_local_disk_size: float  # GB
    local_disk_group_shared: bool
    min_residency_s: float
    node_tier: bool
    max_node_size: float  # GB
    node_dir: str
    remote: RemoteSettings
    extra_config: dict[str, Any] | None
    cache_policy: str
    namespace: str
    weights_version: str
    purge_check_s: float
    read_threads: int
    close_timeout: float
    timeline_path: str | None  # the vLLM connector's per-request timeline; None: off
    source: str  # where the settings came from (a path, "config dict", …)

    @property
    def cpu_bytes(self) -> int:
        return gb_to_bytes(self.max_local_cpu_size)

    @property
    def disk_bytes(self) -> int:
        return gb_to_bytes(self.max_local_disk_size)

    @property
    def node_bytes(self) -> int:
        return gb_to_bytes(self.max_node_size)

    @property
    def shared_tier(self) -> bool:
        """A tier other processes read what this one writes: the disk directory,
        the node tier (every process of the node) or a remote tier."""
        return bool(self.local_disk) or self.node_tier or self.remote.configured

    def _option(self, name: str) -> Any:
        """The value of the ``ec:`` key ``name`` as LMCache takes it (the export)."""
        if name == "remote_storage_plugins":
            return list(self.remote.plugins) or None
        if name in REMOTE_FIELDS:
            return getattr(self.remote, REMOTE_FIELDS[name])
        return getattr(self, name)

    def to_lmcache(self) -> Any:
        """The ``LMCacheEngineConfig`` LMCache's StorageManager is built from.

        This config rides along typed under one ``extra_config`` key: the tiers
        and the remote backend read it (``from_lmcache``), nothing parses strings.
        """
        from lmcache.v1.config import LMCacheEngineConfig

        settings = {
            name: value
            for name, opt in SCHEMA.items()
            if opt.lmcache and (value := self._option(name)) is not None
        }
        if not self.local_disk:
            settings.pop("max_local_disk_size", None)
        extra = dict(settings.get("extra_config") or {})
        extra[_EXTRA_KEY] = self
        settings["extra_config"] = extra
        return LMCacheEngineConfig.from_defaults(**settings)


def from_lmcache(lmcache_config: Any) -> ECConfig:
    """The ``ECConfig`` that ``to_lmcache`` built ``lmcache_config`` from."""
    found = (getattr(lmcache_config, "extra_config", None) or {}).get(_EXTRA_KEY)
    if not isinstance(found, ECConfig):
        raise ValueError("the LMCache config was not built by ECConfig.to_lmcache")
    return found


def _build(resolved: dict[str, Any], source: str) -> ECConfig:
    """The typed config from resolved, checked option values (one per schema key)."""
    remote = {REMOTE_FIELDS[name]: resolved.pop(name) for name in REMOTE_FIELDS}
    for name in ("url", "s3_endpoint_url", "s3_region", "s3_addressing_style"):
        remote[name] = remote[name] or None  # "" is unset
    remote["plugins"] = tuple(remote["plugins"] or ())
    # No frame larger than the CPU pool can be put or promoted: reads take no more.
    remote["max_frame_bytes"] = gb_to_bytes(resolved["max_local_cpu_size"])
    if resolved["local_disk"]:
        resolved["local_disk"] = _disk_path(resolved["local_disk"])
    return ECConfig(remote=RemoteSettings(**remote), source=source, **resolved)


def _read_yaml(path: str) -> Mapping[str, Any]:
    try:
        with open(path, encoding="utf-8") as stream:
            loaded = yaml.safe_load(stream)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, yaml.YAMLError, ValueError) as exc:
        # ValueError: not UTF-8, or a NUL byte in the path.
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"cannot read config file {path}: nested too deeply") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return loaded


def _ec_section(document: Mapping[str, Any], origin: str) -> dict[str, tuple[Any, str]]:
    """The ``ec:`` keys of a full LMCache config document, with their origin."""
    found: dict[str, tuple[Any, str]] = {}
    section = document.get("ec")
    if section is not None:
        if not isinstance(section, dict):
            raise ConfigError(f"{origin}: 'ec' must be a mapping")
        for name, value in section.items():
            found[str(name).lower()] = (value, f"{origin} ec.{name}")
    for name, value in document.items():
        lower = str(name).lower()
        if lower.startswith(FILE_PREFIX) and lower != "ec":
            found.setdefault(lower[len(FILE_PREFIX) :], (value, f"{origin} {name}"))
    return found


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | ECConfig | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> ECConfig:
    """Resolve the encoder tier's settings.

    ``source``: a YAML path; a mapping shaped like the YAML file (with an
    ``ec`` key) or holding the ``ec`` section's keys directly; or ``None`` for
    ``$LMCACHE_CONFIG_FILE`` and then the embedded default; an ``ECConfig``
    is returned as it is.
    """
    if isinstance(source, ECConfig):
        return source
    environ = os.environ if environ is None else environ
    raw: dict[str, tuple[Any, str]]
    if source is None and environ.get(CONFIG_FILE_ENV):
        source = environ[CONFIG_FILE_ENV]
    if source is None:
        origin = "embedded default"
        raw = {k: (v, origin) for k, v in embedded_default().items()}
    elif isinstance(source, Mapping):
        origin = "config dict"
        if "ec" in source or any(str(k).startswith(FILE_PREFIX) for k in source):
            raw = _ec_section(source, origin)
        else:
            raw = {str(k).lower(): (v, f"{origin} {k}") for k, v in source.items()}
    else:
        origin = os.fspath(source)
        raw = _ec_section(_read_yaml(origin), origin)

    for env_name, env_value in environ.items():
        if env_name.startswith(ENV_PREFIX):
            raw[env_name[len(ENV_PREFIX) :].lower()] = (env_value, env_name)

    resolved = {name: opt.default for name, opt in SCHEMA.items()}
    for name, (value, where) in _resolve_aliases(raw).items():
        opt = SCHEMA.get(name)
        if opt is None:
            raise ConfigError(f"{where}: {_unknown_key(name)}")
        coerced = _coerce(opt, value, where)
        if coerced is not None and opt.check is not None:
            problem = opt.check(coerced)
            if problem:
                raise ConfigError(f"{where}: '{name}' {problem}")
        resolved[name] = coerced
    return _build(resolved, origin)


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


def _resolve_aliases(raw: dict[str, tuple[Any, str]]) -> dict[str, tuple[Any, str]]:
    """``raw`` with LMCache aliases renamed to their lmcache-ec key.

    An alias and its key both set by the file (or both by the environment) is
    an error unless they agree; otherwise the environment wins, as usual.
    """
    resolved = {name: entry for name, entry in raw.items() if name not in ALIASES}
    for name, (value, where) in raw.items():
        target = ALIASES.get(name)
        if target is None:
            continue
        earlier = resolved.get(target)
        if earlier is None or (_is_env(where) and not _is_env(earlier[1])):
            resolved[target] = (value, where)
        elif _is_env(where) == _is_env(earlier[1]) and earlier[0] != value:
            raise ConfigError(
                f"{where}: '{name}' is LMCache's name for '{target}', which "
                f"{earlier[1]} sets to another value; set only '{target}'"
            )
    return resolved


def _is_env(where: str) -> bool:
    return where.startswith(ENV_PREFIX)


def _unknown_key(name: str) -> str:
    if name in REPLACED:
        return f"LMCache key '{name}' is not taken in ec: {REPLACED[name]}"
    if name in _lmcache_keys():
        return (
            f"'{name}' is an LMCache KV-cache setting with no meaning for encoder outputs "
            "(set it at the top level of the file, for the KV cache)"
        )
    known = ", ".join(sorted(SCHEMA))
    aliases = ", ".join(f"{a} (= {t})" for a, t in sorted(ALIASES.items()))
    return f"unknown key '{name}' (known keys: {known}; LMCache aliases: {aliases})"


def _lmcache_keys() -> frozenset[str]:
    try:
        from lmcache.v1.config import _CONFIG_DEFINITIONS
    except ImportError:  # another LMCache layout: plain unknown-key message
        return frozenset()
    return frozenset(_CONFIG_DEFINITIONS)


def _disk_path(value: str) -> str:
    path = value[len("file://") :] if value.startswith("file://") else value
    if "," in path:
        raise ConfigError("'local_disk' takes one directory for the encoder tier")
    if "\0" in path:
        raise ConfigError("'local_disk' must not contain a NUL byte")
    return str(Path(path).expanduser().resolve())
