"""The remote tier: encoder outputs shared by every instance through Redis or S3.

- ``naming``: where an entry lives in each store (one naming for all users).
- ``redis_connector``: LMCache's ``RedisConnector``, bounded and closable.
- ``s3_connector`` / ``s3_client``: lmcache-ec's boto3 ``RemoteConnector``,
  loaded through LMCache's Remote Storage Plugin Framework as ``ec_s3``.
- ``backend``: ``ECRemoteBackend``, LMCache's ``RemoteBackend`` with
  timeouts, health probing and reconnection, de-duplicated uploads.
- ``catalog``: ``open_catalog`` / ``RemoteCatalog`` for processes that look
  at the store without serving from it (vLLM scheduler, CLI).

Configuration lives in the ``ec:`` section (``remote_url``,
``remote_timeout``, ``remote_retry_interval``, ``s3_*``; see
``lmcache_ec.config.SCHEMA``).
"""

from .catalog import RemoteCatalog, RemoteCatalogError, open_catalog

__all__ = ["RemoteCatalog", "RemoteCatalogError", "open_catalog"]
