"""The ``ec:`` remote options and how they reach LMCache."""

from __future__ import annotations

import pytest

from lmcache_ec.config import ConfigError, from_lmcache, load_config
from lmcache_ec.config_schema import SCHEMA
from lmcache_ec.remote_names import parse_s3_url


def test_s3_settings_reach_the_remote_tier_typed():
    config = load_config(
        {
            "remote_url": "s3://my-bucket/shared/encoders/",
            "s3_endpoint_url": "http://minio:9000",
            "s3_region": "eu-west-1",
            "remote_timeout": 3,
        }
    )
    lmcache = config.to_lmcache()
    assert from_lmcache(lmcache) is config  # typed, never parsed back from strings
    settings = config.remote
    assert settings.url == "s3://my-bucket/shared/encoders/"
    location = parse_s3_url(settings.url)
    assert (location.bucket, location.prefix) == ("my-bucket", "shared/encoders")
    assert settings.s3_endpoint_url == "http://minio:9000"
    assert settings.s3_region == "eu-west-1"
    assert settings.timeout == 3.0
    assert settings.retry_interval == SCHEMA["remote_retry_interval"].default
    # Nothing encoded into strings for a plugin to parse back.
    assert not lmcache.remote_storage_plugins
    assert [k for k in lmcache.extra_config if k.startswith("lmcache_ec")] == ["lmcache_ec.config"]


def test_redis_url_stays_lmcache_remote_url():
    lmcache = load_config({"remote_url": "rediss://user:pw@host:6380/2"}).to_lmcache()
    assert lmcache.remote_url == "rediss://user:pw@host:6380/2"
    assert not lmcache.remote_storage_plugins


def test_remote_options_from_environment():
    config = load_config(
        {"remote_url": "redis://h:1"},
        environ={"LMCACHE_EC_REMOTE_TIMEOUT": "0.25", "LMCACHE_EC_S3_REGION": "us-east-2"},
    )
    assert config.remote.timeout == 0.25
    assert config.remote.s3_region == "us-east-2"


@pytest.mark.parametrize(
    "values",
    [
        {"remote_url": "s3://"},
        {"remote_url": "s3://key:secret@bucket/p"},
        {"remote_url": "s3://bucket/p?region=x"},
        {"remote_url": "redis://h:1", "remote_timeout": 0},
        {"remote_url": "s3://b/p", "s3_addressing_style": "sideways"},
    ],
)
def test_invalid_remote_settings_are_refused(values):
    with pytest.raises(ConfigError):
        load_config(values)
