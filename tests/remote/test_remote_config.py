"""The ``ec:`` remote options and how they reach LMCache."""

from __future__ import annotations

import pytest

from lmcache_ec.config import ConfigError, load_config


def test_s3_url_becomes_the_ec_s3_plugin():
    config = load_config(
        {
            "remote_url": "s3://my-bucket/shared/encoders/",
            "s3_endpoint_url": "http://minio:9000",
            "s3_region": "eu-west-1",
            "remote_timeout": 3,
        }
    )
    lmcache = config.to_lmcache()
    assert lmcache.remote_url is None
    assert lmcache.remote_storage_plugins == ["ec_s3"]
    extra = lmcache.extra_config
    prefix = "remote_storage_plugin.ec_s3."
    assert extra[prefix + "module_path"] == "lmcache_ec.remote.s3_connector"
    assert extra[prefix + "class_name"] == "ECS3Connector"
    assert extra[prefix + "bucket"] == "my-bucket"
    assert extra[prefix + "prefix"] == "shared/encoders"
    assert extra[prefix + "endpoint_url"] == "http://minio:9000"
    assert extra[prefix + "region"] == "eu-west-1"
    assert extra["ec.remote_timeout"] == 3.0


def test_redis_url_stays_lmcache_remote_url():
    lmcache = load_config({"remote_url": "rediss://user:pw@host:6380/2"}).to_lmcache()
    assert lmcache.remote_url == "rediss://user:pw@host:6380/2"
    assert not lmcache.remote_storage_plugins


def test_remote_options_from_environment():
    config = load_config(
        {"remote_url": "redis://h:1"},
        environ={"LMCACHE_EC_REMOTE_TIMEOUT": "0.25", "LMCACHE_EC_S3_REGION": "us-east-2"},
    )
    assert config.remote_timeout == 0.25
    assert config.s3_region == "us-east-2"


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
