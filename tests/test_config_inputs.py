"""Config values as users write them: each one is taken as meant or refused with a
``ConfigError`` naming the key (exit 2 in the CLI), never a traceback and never a
setting that loads but cannot work.

- a str option (``weights_version``, ``namespace`` …) is taken as written in the
  YAML file: ``1.10`` is not ``1.1`` and ``010`` is not ``8``, so entries of
  distinct versions or tenants never meet; a float handed from Python, whose
  written form is lost, is refused;
- a path option (``local_disk``, ``node_dir``, ``timeline_path``) with a NUL
  byte, a ``~user`` of no such user or a number past a float's range is a
  ``ConfigError``; a disk directory through a symlink loop starts the engine
  without the disk tier;
- a remote setting that can never open (an S3 endpoint that is no http(s) URL,
  a bad region, ``REDIS://``, Redis URL options that would override
  ``remote_timeout``) is refused at load; a connector that cannot be built is
  logged once, not at every probe, and an endpoint's password never reaches a log.
"""

from __future__ import annotations

import logging
import re
import time

import pytest
import torch
from typer.testing import CliRunner

from lmcache_ec.cli import app
from lmcache_ec.config import ConfigError, load_config
from lmcache_ec.integration.vllm.timeline import TimelineWriter

BIG = "9" * 400  # an int past a float's range: math.isfinite(int) overflows


def _yaml(tmp_path, body: str) -> str:
    """A config file with ``body`` (lines of the ec: section) as written, unquoted."""
    path = tmp_path / "c.yaml"
    path.write_text("ec:\n" + "".join(f"  {line}\n" for line in body.splitlines()))
    return str(path)


def _poll(condition, bound: float = 10.0) -> None:
    end = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.05)


# -- str options: as written --------------------------------------------------------


@pytest.mark.parametrize("key", ["weights_version", "namespace"])
@pytest.mark.parametrize(
    ("one", "other"),
    [("1.1", "1.10"), ("8", "010"), ("10", "1_0"), ("1.0", "1.00"), ("0.5", ".5"), ("80", "1:20")],
)
def test_distinct_unquoted_yaml_values_of_a_string_option_stay_distinct(tmp_path, key, one, other):
    first = getattr(load_config(_yaml(tmp_path, f"{key}: {one}"), environ={}), key)
    second = getattr(load_config(_yaml(tmp_path, f"{key}: {other}"), environ={}), key)
    assert (first, second) == (one, other)


def test_a_version_written_in_yaml_is_the_same_as_in_the_environment(tmp_path):
    from_file = load_config(_yaml(tmp_path, "weights_version: 1.10"), environ={})
    from_env = load_config({}, environ={"LMCACHE_EC_WEIGHTS_VERSION": "1.10"})
    assert from_file.weights_version == from_env.weights_version == "1.10"


def test_an_unquoted_whole_number_and_other_options_keep_working(tmp_path):
    body = "weights_version: 3\nlocal_cpu: yes\nmax_local_cpu_size: 0.5\nread_threads: 4"
    config = load_config(_yaml(tmp_path, body), environ={})
    assert config.weights_version == "3"
    assert config.local_cpu is True and config.max_local_cpu_size == 0.5
    assert config.read_threads == 4
    assert load_config({"weights_version": 3}, environ={}).weights_version == "3"


def test_a_string_option_from_a_yaml_merge_key_is_taken_as_written(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base: &base\n  weights_version: 1.10\nec:\n  <<: *base\n  namespace: 010\n")
    config = load_config(str(path), environ={})
    assert (config.weights_version, config.namespace) == ("1.10", "010")


@pytest.mark.parametrize("key", ["weights_version", "namespace"])
def test_a_float_for_a_string_option_from_python_is_refused(key):
    with pytest.raises(ConfigError, match=f"config dict {key}: invalid value 1.1: .*quote"):
        load_config({key: 1.1}, environ={})


def test_an_engine_on_weights_1_10_never_reads_the_entry_of_weights_1_1(tmp_path, disk_dir):
    from lmcache_ec import ECCache

    disk = f"local_disk: {disk_dir}\nmax_local_cpu_size: 0.01\n"
    old = torch.full((4, 8), 1.1)
    with ECCache.from_config(_yaml(tmp_path, disk + "weights_version: 1.1"), model="m") as c:
        assert c.put("img", old) and c.flush(timeout=10)
    with ECCache.from_config(_yaml(tmp_path, disk + "weights_version: 1.10"), model="m") as c:
        assert c.get("img") is None
    with ECCache.from_config(_yaml(tmp_path, disk + "weights_version: 1.1"), model="m") as c:
        assert torch.equal(c.get("img"), old)  # the entry is there, under its own key


# -- tracebacks, paths ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (f"read_threads: {BIG}", "ec.read_threads: 'read_threads' must be at most 256"),
        (f"max_local_cpu_size: {BIG}", "ec.max_local_cpu_size: invalid value"),
        ("local_disk: ~nosuchuser-ec/cache", "ec.local_disk: 'local_disk' names an unknown home"),
    ],
    ids=["read_threads", "max_local_cpu_size", "unknown_home"],
)
def test_a_value_past_any_use_is_a_config_error_in_the_cli_not_a_traceback(tmp_path, body, says):
    path = _yaml(tmp_path, body)
    with pytest.raises(ConfigError, match=says):
        load_config(path, environ={})
    result = CliRunner().invoke(app, ["ls", "--config", path])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert says in "".join(result.output.split("\n"))


def test_a_read_threads_past_a_floats_range_in_the_environment_names_the_variable():
    with pytest.raises(ConfigError, match="LMCACHE_EC_READ_THREADS: 'read_threads' must be at"):
        load_config({}, environ={"LMCACHE_EC_READ_THREADS": BIG})


def test_a_disk_directory_through_a_symlink_loop_starts_the_engine_without_it(tmp_path, make_cache):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for disk in (tmp_path / "loop", tmp_path / "loop" / "store"):
        cache = make_cache(local_disk=str(disk))
        assert cache.tiers == ["cpu"]
        assert cache.put("x", torch.ones(2, 2)) and torch.equal(cache.get("x"), torch.ones(2, 2))


@pytest.mark.parametrize("key", ["local_disk", "node_dir", "timeline_path"])
def test_a_path_with_a_nul_byte_is_refused_at_load_naming_the_key(tmp_path, key):
    with pytest.raises(ConfigError, match=f"{key}: '{key}' must not contain a NUL byte"):
        load_config({key: f"{tmp_path}/a\0b"}, environ={})


def test_a_timeline_that_cannot_be_written_is_off_with_one_warning(tmp_path, caplog):
    writer = TimelineWriter(f"{tmp_path}/t\0l")
    with caplog.at_level(logging.WARNING, logger="lmcache_ec.integration.vllm.timeline"):
        writer.write({"a": 1})
        writer.write({"a": 2})
    assert [r.getMessage()[:12] for r in caplog.records] == ["Timeline off"]


# -- remote settings that could never open -------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("nota url", "http:// or https://"),
        ("ftp://h:1", "http:// or https://"),
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://my_minio:9000", "invalid host name"),
        ("http://minio :9000", "white space"),
    ],
    ids=["no_url", "ftp", "port", "underscore", "space"],
)
def test_an_s3_endpoint_that_can_never_open_is_refused_at_load(endpoint, says):
    with pytest.raises(ConfigError, match="s3_endpoint_url") as info:
        load_config({"remote_url": "s3://b/p", "s3_endpoint_url": endpoint}, environ={})
    assert says in str(info.value)


@pytest.mark.parametrize(
    "endpoint",
    ["http://minio:9000", "https://s3.eu-west-1.amazonaws.com", "http://[::1]:9000/s3"],
)
def test_usable_s3_endpoints_load(endpoint):
    config = load_config({"remote_url": "s3://b/p", "s3_endpoint_url": endpoint}, environ={})
    assert config.remote.s3_endpoint_url == endpoint


def test_an_s3_region_that_is_no_region_name_is_refused_at_load():
    with pytest.raises(ConfigError, match="s3_region: 's3_region' must be a region name"):
        load_config({"remote_url": "s3://b/p", "s3_region": "x y"}, environ={})
    assert load_config({"s3_region": "eu-west-1"}, environ={}).remote.s3_region == "eu-west-1"


@pytest.mark.parametrize("url", ["REDIS://h:6379", "Rediss://h:6379", "UNIX:///tmp/r.sock"])
def test_a_redis_scheme_not_in_lower_case_is_refused_at_load(url):
    with pytest.raises(ConfigError, match="must be written in lower case"):
        load_config({"remote_url": url}, environ={})


def test_a_unix_socket_url_without_slashes_and_with_capitals_in_its_path_loads():
    url = "unix:/tmp/Redis.sock"  # redis-py takes it: the scheme is lower case
    assert load_config({"remote_url": url}, environ={}).remote.url == url


@pytest.mark.parametrize(
    "query",
    [
        "socket_timeout=15",
        "socket_timeout=abc",
        "socket_connect_timeout=15",
        "timeout=15",
        "retry_on_timeout=true",
        "retry_on_error=x",
    ],
)
def test_redis_url_options_overriding_remote_timeout_are_refused(query):
    with pytest.raises(ConfigError, match="remote_timeout bounds every Redis call"):
        load_config({"remote_url": f"redis://h:6379/0?{query}"}, environ={})


def test_redis_url_options_redis_py_cannot_parse_are_refused_and_others_load():
    with pytest.raises(ConfigError, match="db='x' is not a whole number"):
        load_config({"remote_url": "redis://h:6379?db=x"}, environ={})
    url = "redis://h:6379?db=2&max_connections=8"
    assert load_config({"remote_url": url}, environ={}).remote.url == url


@pytest.mark.parametrize(
    ("query", "refusal"),
    [
        ("db=-1", "db=-1 is out of range (0 or more)"),
        ("socket_read_size=0", "socket_read_size=0 is out of range (1 or more)"),
        ("max_connections=-1", "max_connections=-1 is out of range (0 or more)"),
        ("protocol=4", "protocol=4 is out of range (2 to 3)"),
    ],
    ids=["db", "socket_read_size", "max_connections", "protocol"],
)
def test_redis_url_options_out_of_range_are_refused_at_load(query, refusal):
    # redis-py takes them, then fails every connect: the tier would stay down for good.
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        load_config({"remote_url": f"redis://h:6379/?{query}"}, environ={})
    for url in ("redis://h:6379/?max_connections=0", "redis://h:6379/?protocol=2&db=15"):
        assert load_config({"remote_url": url}, environ={}).remote.url == url


def _s3_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def _remote(**extra) -> dict:
    return {
        "max_local_cpu_size": 0.01,
        "remote_url": "s3://bucket/p",
        "remote_timeout": 0.5,
        "remote_retry_interval": 0.05,
        "close_timeout": 3,
        **extra,
    }


def test_a_connector_that_cannot_be_built_is_logged_once_not_at_every_probe(
    tmp_path, monkeypatch, caplog, make_cache
):
    _s3_environment(monkeypatch, tmp_path)
    broken = tmp_path / "aws-config"
    broken.write_text("[default\nx")  # botocore refuses to build a client on it
    monkeypatch.setenv("AWS_CONFIG_FILE", str(broken))

    def said() -> list[int]:
        return [r.levelno for r in caplog.records if "not created" in r.getMessage()]

    with caplog.at_level(logging.DEBUG, logger="lmcache_ec.remote.backend"):
        make_cache(_remote())
        _poll(lambda: len(said()) >= 4)  # the first attempt and three probes
    assert said().count(logging.WARNING) == 1


def test_an_s3_endpoint_with_credentials_is_refused_at_load():
    # botocore never uses them; in the URL they would reach every log line naming it.
    with pytest.raises(ConfigError, match=r"s3_endpoint_url.*credentials"):
        load_config(_remote(s3_endpoint_url="http://u:secretpw@127.0.0.1:1"))
