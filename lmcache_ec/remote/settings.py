"""The remote tier's settings, typed: ``ECConfig.remote``.

``lmcache_ec.config.load_config`` builds them once from the ``ec:`` section
(defaults live in its schema only); this module imports no client library.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RemoteSettings:
    """Where the remote tier is and how long any call to it may take (no
    defaults here: the config schema holds them)."""

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
        from .naming import redact

        return f"RemoteSettings(url={redact(self.url)!r}, timeout={self.timeout})"
