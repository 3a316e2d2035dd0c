"""Settings that would load but silently mean something else are refused at load
with a ``ConfigError`` naming the key (and never showing a password):

- a ``remote_url`` that redis-py would rewrite: a path that is no single database
  number (``/team-a`` is db 0, ``/1/2`` is db 12), port 0 (6379), a database
  named twice, or a URL option its connection does not take (every connect
  would fail); the options taken are exactly ones redis-py's connection takes;
- one key spelled twice in one source (``ec.x`` and ``ec_x``, ``x`` and ``X``):
  neither spelling is silently dropped;
- ``local_disk: file://``, which names no directory (it was the working one).
"""

from __future__ import annotations

import pytest

from lmcache_ec import remote_names
from lmcache_ec.config import ConfigError, load_config


def _yaml(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


# -- remote_url: what redis-py would rewrite ----------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://h:6379/team-a", "database number"),  # redis-py: db 0
        ("redis://h:6379/1/2", "database number"),  # redis-py: db 12
        ("redis://h:6379/ 3", "database number"),  # redis-py: db 3
        ("rediss://h:6380/0/", "database number"),
        ("redis://h:6379/1?db=2", "database twice"),  # redis-py: db 2
        ("redis://h:0", "port 0"),  # redis-py: port 6379
        ("redis-cluster://h:7000,h:0", "1-65535"),
        ("redis-sentinel://h:0/main", "1-65535"),
    ],
)
def test_a_redis_url_redis_py_would_rewrite_is_refused_at_load(url, says):
    with pytest.raises(ConfigError, match="'remote_url'") as info:
        load_config({"remote_url": url}, environ={})
    assert says in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:6379?foo=bar",
        "redis://h:6379/0?decode_responses=true",  # frames would come back as text
        "redis://h:6379?ssl_cert_reqs=none",  # TLS options on a plain connection
        "unix:///tmp/r.sock?socket_keepalive=true",
        "redis://h:6379?host=other",
    ],
)
def test_a_redis_url_option_its_connection_does_not_take_is_refused_at_load(url):
    with pytest.raises(ConfigError, match=r"'remote_url' the URL option \w+= is not taken"):
        load_config({"remote_url": url}, environ={})


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:6379",
        "redis://h:6379/",
        "redis://h:6379/15",
        "redis://u:pw@h:6379/0?max_connections=8&client_name=ec",
        "rediss://h:6380/2?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=optional",
        "unix:///tmp/r.sock?db=3",
        "redis-cluster://h:7000,h:7001",
        "redis-sentinel://h:26379/main",
    ],
)
def test_usable_redis_urls_still_load(url):
    assert load_config({"remote_url": url}, environ={}).remote.url == url


# A value redis-py parses for each option the check takes.
_VALUES = {"socket_keepalive": "true", "legacy_responses": "true", "ssl_check_hostname": "false"}
_VALUES |= {"ssl_cert_reqs": "none", "ssl_min_version": "2", "ssl_include_verify_flags": ""}
_VALUES |= {"ssl_exclude_verify_flags": ""} | dict.fromkeys(remote_names._REDIS_INT_OPTIONS, "2")


@pytest.mark.parametrize(
    ("base", "extra"),
    [
        ("redis://h:1", remote_names._REDIS_TCP_OPTIONS),
        ("rediss://h:1", remote_names._REDIS_TCP_OPTIONS | remote_names._REDIS_TLS_OPTIONS),
        ("unix:///tmp/r.sock", frozenset()),
    ],
)
def test_every_url_option_taken_is_one_redis_pys_connection_takes(base, extra):
    redis = pytest.importorskip("redis")
    for name in sorted(remote_names._REDIS_OPTIONS | extra):
        url = f"{base}?{name}={_VALUES.get(name, 'x')}"
        assert load_config({"remote_url": url}, environ={}).remote.url == url
        # Builds the connection as every connect would, without connecting.
        redis.ConnectionPool.from_url(url).make_connection()


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:123/s3cret@h:6379",  # the password's digits parse as a port
        "redis://u:1?db=s3cret@h:6379",
        "rediss://u:9#s3cret@h:6380",
    ],
)
def test_a_refused_redis_url_never_shows_a_password(url):
    with pytest.raises(ConfigError, match="percent-encoded") as info:
        load_config({"remote_url": url}, environ={})
    assert "s3cret" not in str(info.value)


# -- one key, two spellings, one source -----------------------------------------------


WV = "weights_version"


@pytest.mark.parametrize(
    ("text", "spellings"),
    [
        (f"ec_{WV}: v2\nec:\n  {WV}: v1\n", (f"ec.{WV}", f"ec_{WV}")),
        (f"ec:\n  {WV}: v1\n  {WV.upper()}: v2\n", (f"ec.{WV}", f"ec.{WV.upper()}")),
        (f"ec_{WV}: v1\nEC_{WV.upper()}: v2\n", (f"ec_{WV}", f"EC_{WV.upper()}")),
        (f"ec:\n  {WV}: v1\nec_{WV}: v1\n", (f"ec.{WV}", f"ec_{WV}")),  # even agreeing
    ],
    ids=["section-and-prefix", "two-cases-in-section", "two-cases-of-prefix", "agreeing"],
)
def test_one_key_spelled_twice_in_one_file_is_refused_naming_both(tmp_path, text, spellings):
    path = _yaml(tmp_path, text)
    with pytest.raises(ConfigError, match=f"'{WV}' is also set by") as info:
        load_config(path, environ={})
    for spelling in spellings:  # each as written, after the file it is in
        assert f"{path} {spelling}" in str(info.value)


def test_one_key_spelled_twice_in_a_dict_or_the_environment_is_refused():
    with pytest.raises(ConfigError, match="'namespace' is also set by config dict namespace"):
        load_config({"namespace": "a", "NAMESPACE": "b"}, environ={})
    environ = {"LMCACHE_EC_NAMESPACE": "a", "LMCACHE_EC_namespace": "b"}
    with pytest.raises(ConfigError, match="LMCACHE_EC_namespace: 'namespace' is also set by"):
        load_config({}, environ=environ)


def test_a_key_set_once_per_source_keeps_the_usual_precedence(tmp_path):
    path = _yaml(tmp_path, "EC:\n  WEIGHTS_VERSION: v1\nec_namespace: team\n")
    config = load_config(path, environ={"LMCACHE_EC_WEIGHTS_VERSION": "v2"})
    assert (config.weights_version, config.namespace) == ("v2", "team")


# -- local_disk: file:// ---------------------------------------------------------------


def test_a_file_url_with_no_path_is_refused_not_taken_as_the_working_directory(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="'local_disk' 'file://' names no directory"):
        load_config({"local_disk": "file://"}, environ={})
    store = tmp_path / "store"
    assert load_config({"local_disk": f"file://{store}"}, environ={}).local_disk == str(store)
