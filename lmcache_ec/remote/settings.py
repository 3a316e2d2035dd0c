"""The remote tier's settings, typed, built once from the ``ec:`` section.

Defaults live in the config schema only (``lmcache_ec.config.SCHEMA``): this
module takes values that are already resolved and imports no client library.

LMCache builds the remote backend from its own ``LMCacheEngineConfig``; the
one seam through which these settings reach it is ``attach``/``attached``
(an object under one ``extra_config`` key, never parsed from strings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_EXTRA_KEY = "lmcache_ec.remote_settings"


@dataclass(frozen=True)
class RemoteSettings:
    """Where the remote tier is and how long any call to it may take."""

    url: str | None  # None: no remote_url (remote storage plugins only, or no remote)
    timeout: float  # seconds, bound of every remote operation
    retry_interval: float  # seconds between health probes while unavailable
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_addressing_style: str | None = None  # None: path with an endpoint, else AWS's
    # The largest frame a read takes (the CPU pool's size: no larger entry can be
    # put or promoted here); a read never allocates more than this, plus one byte.
    max_frame_bytes: int = 1 << 30

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> RemoteSettings:
        """From resolved ``ECConfig.values`` (schema defaults already applied)."""
        return cls(
            url=values.get("remote_url") or None,
            timeout=float(values["remote_timeout"]),
            retry_interval=float(values["remote_retry_interval"]),
            s3_endpoint_url=values.get("s3_endpoint_url") or None,
            s3_region=values.get("s3_region") or None,
            s3_addressing_style=values.get("s3_addressing_style") or None,
            max_frame_bytes=int(float(values["max_local_cpu_size"]) * 1024**3),
        )

    def __repr__(self) -> str:  # the URL may carry a password
        from .naming import redact

        return f"RemoteSettings(url={redact(self.url)!r}, timeout={self.timeout})"


def attach(extra_config: dict[str, Any], settings: RemoteSettings) -> None:
    """Carry ``settings`` inside LMCache's ``extra_config`` (the seam)."""
    extra_config[_EXTRA_KEY] = settings


def attached(lmcache_config: Any) -> RemoteSettings | None:
    """The settings ``attach`` put into an ``LMCacheEngineConfig``, if any."""
    found = (getattr(lmcache_config, "extra_config", None) or {}).get(_EXTRA_KEY)
    return found if isinstance(found, RemoteSettings) else None
