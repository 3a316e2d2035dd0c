"""S3 settings of the encoder tier and the boto3 client built from them.

Credentials are never part of the settings: boto3 takes them from the usual
AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
shared config files, instance or container roles). ``endpoint_url`` points
the client at any S3-compatible store (MinIO, Ceph RGW, R2, moto …).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .naming import S3_PLUGIN_KEY, S3Location, parse_s3_url

ADDRESSING_STYLES = ("path", "virtual", "auto")


@dataclass(frozen=True)
class S3Settings:
    location: S3Location
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: str | None = None  # None: path with an endpoint, else AWS's default
    timeout: float = 2.0

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> S3Settings:
        """From ``ECConfig.values`` (``remote_url: s3://bucket/prefix`` + ``s3_*``)."""
        return cls(
            location=parse_s3_url(values["remote_url"]),
            endpoint_url=values.get("s3_endpoint_url") or None,
            region=values.get("s3_region") or None,
            addressing_style=values.get("s3_addressing_style") or None,
            timeout=float(values.get("remote_timeout") or 2.0),
        )

    def to_extra_config(self) -> dict[str, Any]:
        """The ``remote_storage_plugin.ec_s3.*`` entries of LMCache's extra_config."""
        return {
            S3_PLUGIN_KEY + "bucket": self.location.bucket,
            S3_PLUGIN_KEY + "prefix": self.location.prefix,
            S3_PLUGIN_KEY + "endpoint_url": self.endpoint_url,
            S3_PLUGIN_KEY + "region": self.region,
            S3_PLUGIN_KEY + "addressing_style": self.addressing_style,
            S3_PLUGIN_KEY + "timeout": self.timeout,
        }

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any]) -> S3Settings:
        def get(name: str) -> Any:
            return extra.get(S3_PLUGIN_KEY + name)

        bucket = get("bucket")
        if not bucket:
            raise ValueError(f"extra_config lacks {S3_PLUGIN_KEY}bucket")
        return cls(
            location=S3Location(bucket=str(bucket), prefix=str(get("prefix") or "").strip("/")),
            endpoint_url=get("endpoint_url") or None,
            region=get("region") or None,
            addressing_style=get("addressing_style") or None,
            timeout=float(get("timeout") or 2.0),
        )


def make_client(settings: S3Settings, max_pool_connections: int = 10) -> Any:
    """A boto3 S3 client whose every request is bounded by ``settings.timeout``.

    No retries inside botocore: a failed call is reported at once and the
    caller (the remote tier's health check) decides when to try again.
    """
    import boto3
    from botocore.config import Config

    style = settings.addressing_style or ("path" if settings.endpoint_url else "auto")
    config = Config(
        connect_timeout=settings.timeout,
        read_timeout=settings.timeout,
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": style},
    )
    session = boto3.session.Session()
    return session.client(
        "s3", endpoint_url=settings.endpoint_url, region_name=settings.region, config=config
    )


def is_not_found(exc: BaseException) -> bool:
    """True for a botocore ``ClientError`` meaning the object or bucket is absent."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("404", "NoSuchKey", "NotFound") or status == 404
