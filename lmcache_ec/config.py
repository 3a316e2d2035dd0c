"""The ``ec:`` section of the LMCache YAML file: sources, validation, ``ECConfig``.

Sources, lowest precedence first:

1. the defaults of the key table (``config_schema.SCHEMA``);
2. the ``ec:`` mapping of the YAML file (and top-level ``ec_<key>`` entries,
   LMCache 0.5.6's flat spelling of the same keys; the section, the prefix and
   the keys in any letter case) — or, with no file at all,
   the embedded default (CPU tier + a disk tier under the user's cache dir);
3. ``LMCACHE_EC_<KEY>`` environment variables.

Top-level keys of the file are the KV cache's and are not inherited: the two
caches are sized independently, and the KV defaults (a 5 GB CPU pool) would
be wrong for encoder outputs.

Inside ``ec:`` the keys are LMCache's own (``local_cpu``, ``max_local_cpu_size``
in GB, ``local_disk``, ``max_local_disk_size`` in GB, ``remote_url`` …) plus
lmcache-ec's additions. Unknown keys and invalid values raise ``ConfigError``
naming the key and where it came from; so does a key left empty (YAML null)
whose default is set: leave the key out to get its default; and so does a key
set twice by one source (``ec.x`` and ``ec_x``, or ``x`` and ``X``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs
import yaml

from .config_schema import ALIASES, REMOTE_FIELDS, REPLACED, SCHEMA, Option, gb_to_bytes
from .remote_names import redact, redact_text

ENV_PREFIX = "LMCACHE_EC_"
CONFIG_FILE_ENV = "LMCACHE_CONFIG_FILE"
FILE_PREFIX = "ec_"
SECRET_KEYS = ("remote_url", "s3_endpoint_url")  # values may hold a password: redacted in errors


logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


def default_disk_dir() -> str:
    """The embedded default's disk directory; "" (no disk tier) where this user
    has no cache directory (no HOME, no passwd entry): an engine still starts."""
    try:
        return str(Path(platformdirs.user_cache_dir("lmcache-ec")) / "store")
    except (RuntimeError, KeyError, OSError) as exc:
        logger.warning("No disk tier by default: no cache directory for this user (%s)", exc)
        return ""


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
            return _text(value)
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
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # int(inf): Overflow
        shown = repr(value)
        if opt.name in SECRET_KEYS:  # redacted before it is cut: no password half-shown
            shown = redact_text(shown)
        raise ConfigError(f"{where}invalid value {shown:.80}: {exc}") from None
    raise AssertionError(opt.kind)


def _text(value: Any) -> str:
    """A str option's value. A YAML file's come as written (``_read_yaml``); a float
    from a mapping has lost its written form (1.10 is 1.1): refused, never merged."""
    if isinstance(value, float):
        raise ValueError(f"expected a string: quote it, a number loses digits ({value!r})")
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError("expected a string")
    return str(value)


@dataclass(frozen=True)
class RemoteSettings:
    """The remote tier's settings, ``ECConfig.remote``: where it is and how long
    any call to it may take (no defaults here: the key table holds them)."""

    url: str | None  # None: no remote_url (remote storage plugins only, or no remote)
    timeout: float  # seconds, bound of every remote operation
    retry_interval: float  # seconds between health probes while unavailable
    s3_endpoint_url: str | None
    s3_region: str | None
    s3_addressing_style: str | None  # None: path with an endpoint, else AWS's
    serde: str  # LMCache's serializer for plugin stores
    plugins: tuple[str, ...]  # LMCache remote storage plugins
    # The largest frame a read takes (the CPU pool's size: no larger entry can be
    # put or promoted here); a read never allocates more than this, plus one byte.
    max_frame_bytes: int

    @property
    def configured(self) -> bool:
        """A remote tier exists: a ``remote_url`` store or storage plugins."""
        return self.url is not None or bool(self.plugins)

    def __repr__(self) -> str:  # the URL may carry a password
        return f"RemoteSettings(url={redact(self.url)!r}, timeout={self.timeout})"


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
    return ECConfig(remote=RemoteSettings(**remote), source=source, **resolved)


class _AsWritten(yaml.SafeLoader):
    """``safe_load`` with every scalar but null kept as written: YAML reads ``1.10``
    as 1.1, ``010`` as 8 and ``1_0`` as 10, and distinct versions would meet."""


for _tag in ("bool", "int", "float", "timestamp"):
    _AsWritten.add_constructor(f"tag:yaml.org,2002:{_tag}", yaml.SafeLoader.construct_scalar)


def _read_yaml(path: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The file's document as ``safe_load`` types it, and with scalars as written."""
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
        loaded = yaml.safe_load(text)
        written = yaml.load(text, Loader=_AsWritten)  # a SafeLoader: no objects built
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, yaml.YAMLError, ValueError) as exc:
        # ValueError: not UTF-8, or a NUL byte in the path.
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"cannot read config file {path}: nested too deeply") from None
    if loaded is None:
        return {}, {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return loaded, written


def _file_section(path: str) -> dict[str, tuple[Any, str]]:
    """The ``ec:`` keys of the file at ``path``; str options take their value as written."""
    typed, written = _read_yaml(path)
    raw = _ec_section(typed, path)
    for name, entry in _ec_section(written, path).items():
        opt = SCHEMA.get(ALIASES.get(name, name))
        if opt is not None and opt.kind == "str" and name in raw:
            raw[name] = entry
    return raw


def _ec_section(document: Mapping[str, Any], origin: str) -> dict[str, tuple[Any, str]]:
    """The ``ec:`` keys of a full LMCache config document, with their origin."""
    found: dict[str, tuple[Any, str]] = {}
    # Any letter case, as top-level ec_<key> and the keys inside: an ``EC:``
    # section is never silently ignored.
    spellings = [key for key in document if str(key).lower() == "ec"]
    if len(spellings) > 1:
        named = " and ".join(repr(key) for key in spellings)
        raise ConfigError(f"{origin}: {named} both name the 'ec' section; keep one")
    section = document[spellings[0]] if spellings else None
    if section is not None:
        if not isinstance(section, dict):
            raise ConfigError(f"{origin}: '{spellings[0]}' must be a mapping")
        for name, value in section.items():
            _add_once(found, str(name).lower(), value, f"{origin} {spellings[0]}.{name}")
    for name, value in document.items():
        lower = str(name).lower()
        if lower.startswith(FILE_PREFIX) and lower != "ec":
            _add_once(found, lower[len(FILE_PREFIX) :], value, f"{origin} {name}")
    return found


def _add_once(found: dict[str, tuple[Any, str]], name: str, value: Any, where: str) -> None:
    """Add one key of a source. Two spellings of it in one source (``ec.x`` and
    ``ec_x``, or ``x`` and ``X``) are refused, even when they agree: a later edit
    of one would otherwise be silently overruled by the other."""
    if name in found:
        raise ConfigError(f"{where}: '{name}' is also set by {found[name][1]}; keep one")
    found[name] = (value, where)


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
        if any(str(k).lower() == "ec" or str(k).lower().startswith(FILE_PREFIX) for k in source):
            raw = _ec_section(source, origin)
        else:
            raw = {}
            for key, value in source.items():
                _add_once(raw, str(key).lower(), value, f"{origin} {key}")
    else:
        origin = os.fspath(source)
        raw = _file_section(origin)

    from_env: dict[str, tuple[Any, str]] = {}
    for env_name, env_value in environ.items():
        if env_name.startswith(ENV_PREFIX):
            _add_once(from_env, env_name[len(ENV_PREFIX) :].lower(), env_value, env_name)
    raw.update(from_env)

    resolved = {name: opt.default for name, opt in SCHEMA.items()}
    for name, (value, where) in _resolve_aliases(raw).items():
        opt = SCHEMA.get(name)
        if opt is None:
            raise ConfigError(f"{where}: {_unknown_key(name)}")
        coerced = _coerce(opt, value, where)
        if coerced is None and opt.default is not None:
            # A key left empty (``namespace:``) would skip every check below.
            raise ConfigError(
                f"{where}: '{name}' must be set (leave the key out for its default {opt.default!r})"
            )
        if coerced is not None and opt.check is not None:
            problem = opt.check(coerced)
            if problem:
                if name in SECRET_KEYS:
                    problem = redact_text(problem)
                raise ConfigError(f"{where}: '{name}' {problem}")
        if name == "local_disk" and coerced:
            coerced = _disk_path(coerced, where)  # here, where its origin is known
        resolved[name] = coerced
    return _build(resolved, origin)


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


def _disk_path(value: str, where: str) -> str:
    path = value[len("file://") :] if value.startswith("file://") else value
    if not path:  # realpath("") is the working directory: entries would land there
        raise ConfigError(f"{where}: 'local_disk' {value!r} names no directory")
    if "," in path:
        raise ConfigError(f"{where}: 'local_disk' takes one directory for the encoder tier")
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):  # ~user of no such user (or no home directory)
        raise ConfigError(f"{where}: 'local_disk' names an unknown home directory ({path})")
    # realpath, not Path.resolve: a symlink loop stays a path the disk tier
    # cannot open (the engine starts without it), not a RuntimeError here.
    return os.path.realpath(expanded)
