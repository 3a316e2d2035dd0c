"""Connector options, read from ``ec_connector_extra_config``.

A bad value is a ``ConfigError`` naming ``ec_connector_extra_config.<key>``:
numbers are finite and >= 0, times (``*_s``) at most one day as the ``ec:``
section's are, counts whole numbers.

Keys (all optional)::

    lmcache_config            path to an LMCache YAML file, or a mapping (the
                              ``ec:`` section's keys or a full document);
                              default: $LMCACHE_CONFIG_FILE, then the embedded
                              default (CPU + disk under the user cache dir)
    model                     model name used in keys and shown by ``ls``
                              (default: vLLM's ``model_config.model``); it does
                              not let two paths of the same weights share
                              entries (vLLM's ``mm_hash`` includes the path)
    persist_non_content_ids   store items whose identifier is not a content
                              hash (vLLM's ``renderer…-mm-<n>-…`` ids, raw user
                              UUIDs, tower-LoRA ``<adapter name>:<hash>`` ids).
                              Default false: such ids restart at 0 per process,
                              are chosen by clients, or name an adapter that
                              another adapter's weights can be served under, so
                              persisting them can hand one image's tensor to
                              another.
    stage_timeout_s           how long a request waits for an item's prefetch
                              (queueing included) before its encoder runs
                              instead, or, on an ec_consumer, before the
                              request is reported unavailable (5.0)
    weights_fingerprint       key outputs by a fingerprint of the loaded encoder
                              weights, retaken after every weight update
                              (``weight_updates.py``); false: only ``ec.weights_version``
                              (true)
    idle_stage_wait_s         with no request running, how long the scheduler
                              waits for a prefetch to land before deferring the
                              request by a step; nobody is stalled (0.5)
    busy_stage_wait_s         the same while requests run, or once the step let
                              one through: the wait delays their step as a
                              read inside it would (0.01)
    remote_lookup_timeout_s   how long a request waits for the remote existence
                              check before its encoder runs instead (0.05)
    negative_lookup_ttl_s     how long a remote "absent" answer is trusted (5.0)
    failed_retry_s            after a failed staging, how long the item is
                              computed instead of loaded (30.0)
    max_pending_saves         saves queued on a worker before new ones are
                              dropped, so the forward pass never waits (64)
    max_staged_mb             bytes of prefetches in flight: ordered and not
                              yet loaded, and the worker memory holding them
                              (MB, 1024)
    max_inflight_items        prefetches in flight at once (>= 1); later ones queue in
                              arrival order (64)
    claim_encodes             ``ec_both``: before encoding an item no tier holds,
                              claim it in a store the instances share (the
                              remote store if it offers claims, else the disk
                              directory); while another instance's claim is
                              live, wait for its output instead (true)
    claim_wait_s              how long a request waits for another instance's
                              encode, and how long this instance's claims
                              last if it dies holding them (0.5)
    in_step_reads             no prefetch: a tier hit is approved at once and
                              the worker reads it inside the step, stalling the
                              batch as a synchronous connector does (false;
                              what ``lmcache-ec bench steps`` compares against)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ...config import ConfigError
from ...config_schema import MAX_SECONDS, MAX_SIZE_GB, _not_finite
from .identity import is_content_identifier


@dataclass(frozen=True)
class ConnectorSettings:
    lmcache_config: Any = None
    model: str | None = None
    persist_non_content_ids: bool = False
    weights_fingerprint: bool = True
    stage_timeout_s: float = 5.0
    idle_stage_wait_s: float = 0.5
    busy_stage_wait_s: float = 0.01
    remote_lookup_timeout_s: float = 0.05
    negative_lookup_ttl_s: float = 5.0
    failed_retry_s: float = 30.0
    max_pending_saves: int = 64
    max_staged_mb: float = 1024.0
    max_inflight_items: int = 64
    claim_encodes: bool = True
    claim_wait_s: float = 0.5
    in_step_reads: bool = False

    def persistable(self, identifier: str) -> bool:
        """Whether outputs of ``identifier`` may be stored and looked up (``identity.py``)."""
        return self.persist_non_content_ids or is_content_identifier(identifier)

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> ConnectorSettings:
        """Validate ``extra``; ``ConfigError`` names the offending key."""
        extra = dict(extra or {})
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in extra.items():
            if name not in known:
                raise ConfigError(
                    f"ec_connector_extra_config: unknown key '{name}' "
                    f"(known keys: {', '.join(sorted(known))})"
                )
            values[name] = _coerce(name, known[name].default, value)
        return cls(**values)


_AT_LEAST_ONE = {"max_inflight_items"}
# Past these a value is a typo, and the waits it becomes overflow: a wait of
# ~2.2e6 s raises OverflowError in the scheduler's selector, at its first hit.
_SECONDS_SUFFIX = "_s"  # every option in seconds, bounded as the ec: section's are
MAX_STAGED_MB = MAX_SIZE_GB * 1024  # the ec: section's largest size: 1 EiB


def _coerce(name: str, default: Any, value: Any) -> Any:
    where = f"ec_connector_extra_config.{name}"
    if name == "lmcache_config":
        if value is not None and not isinstance(value, (str, Mapping)):
            raise ConfigError(f"{where}: expected a path or a mapping")
        return value
    if name == "model":
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{where}: expected a non-empty string")
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        raise ConfigError(f"{where}: expected true or false")
    number = _number(where, default, value)
    if name in _AT_LEAST_ONE and number < 1:
        raise ConfigError(f"{where}: expected a number >= 1 (0 would never prefetch)")
    if name.endswith(_SECONDS_SUFFIX) and number > MAX_SECONDS:
        raise ConfigError(f"{where}: must be at most {MAX_SECONDS:g} (one day)")
    if name == "max_staged_mb" and number > MAX_STAGED_MB:
        raise ConfigError(f"{where}: must be at most {MAX_STAGED_MB} (MB)")
    return number


def _number(where: str, default: int | float, value: Any) -> int | float:
    """``value`` as the option's type: finite, >= 0, and whole for a count."""
    try:
        number = type(default)(value)
    except (TypeError, ValueError, OverflowError):  # int(inf), float(10**400): OverflowError
        raise ConfigError(f"{where}: expected a number, got {value!r:.80}") from None
    # An int is always finite (math.isfinite of a 400-digit one overflows).
    if isinstance(value, bool) or _not_finite(number) or number < 0:
        raise ConfigError(f"{where}: expected a finite number >= 0")
    if isinstance(number, int) and isinstance(value, float) and value != number:
        raise ConfigError(f"{where}: expected a whole number, got {value!r}")
    return number
