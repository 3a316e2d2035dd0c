"""The remote tier: encoder outputs shared by every instance through Redis or S3.

Its settings are ``config.RemoteSettings`` (``ECConfig.remote``); its keys
and URL schemes, ``remote_names`` (pure: config validation reads it).

- ``store``: the ``RemoteStore`` contract and ``open_store``; ``redis_store``
  (standalone, Sentinel: ``sentinel_watch`` follows its primary),
  ``redis_cluster`` and ``s3_store`` implement it; ``bounded``: reads that
  never allocate more than a frame may be.
- ``connector``: any store as LMCache's ``RemoteConnector``; ``buffers``:
  frame bytes in and out of LMCache CPU buffers.
- ``backend``: ``ECRemoteBackend``, LMCache's ``RemoteBackend`` with
  timeouts, health probing and reconnection, de-duplicated uploads.
- ``catalog``: ``open_catalog`` / ``RemoteCatalog`` for processes that look
  at the store without serving from it (vLLM scheduler, CLI).

Nothing here is imported until a remote is configured: importing this
package loads no client library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RemoteCatalog", "RemoteCatalogError", "open_catalog"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import catalog

        return getattr(catalog, name)
    raise AttributeError(name)
