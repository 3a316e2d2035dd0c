"""The ec: section: sources, precedence, validation errors that name the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmcache_ec.config import ConfigError, load_config
from lmcache_ec.config_schema import ALIASES, SCHEMA

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def write_yaml(path: Path, document: dict) -> str:
    path.write_text(yaml.safe_dump(document))
    return str(path)


def test_embedded_default_is_cpu_plus_disk_under_user_cache(tmp_path):
    config = load_config()
    assert config.source == "embedded default"
    assert config.local_cpu is True
    assert config.local_disk.startswith(str(tmp_path / "xdg-cache"))
    assert config.max_local_disk_size > 0


def _embedded_default_of_a_user_without_home(environ: dict[str, str]) -> str:
    """``local_disk`` of the embedded default for a uid with no passwd entry and no
    HOME (``env -i``, a service manager, an arbitrary container uid), or its error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes that user; it never returns to pytest
        code = 1
        try:
            os.close(read)
            for name in ("HOME", "XDG_CACHE_HOME"):  # what platformdirs would go by
                os.environ.pop(name, None)
            os.setgid(54321)
            os.setgroups([])
            os.setuid(54321)
            try:
                said = repr(load_config(environ=environ).local_disk)
            except Exception as exc:
                said = f"{type(exc).__name__}: {exc}"
            os.write(write, said.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as answer:
        said = answer.read()
    assert os.waitpid(pid, 0)[1] == 0
    return said


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become a user without an entry")
def test_a_user_without_a_home_gets_the_embedded_default_without_a_disk_tier(tmp_path):
    """platformdirs raises for such a user: the engine must start all the same."""
    assert _embedded_default_of_a_user_without_home({}) == "''"
    given = str(tmp_path / "disk")
    assert _embedded_default_of_a_user_without_home({"LMCACHE_EC_LOCAL_DISK": given}) == repr(given)


def test_config_file_from_env_and_ec_section(tmp_path, monkeypatch):
    path = write_yaml(
        tmp_path / "lmcache.yaml",
        {
            "chunk_size": 256,
            "max_local_cpu_size": 5.0,  # the KV cache's keys
            "ec": {"local_cpu": True, "max_local_cpu_size": 0.5, "local_disk": "file:///tmp/ec"},
        },
    )
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", path)
    config = load_config()
    assert config.source == path
    assert config.max_local_cpu_size == 0.5  # not the KV cache's 5.0
    assert config.local_disk == "/tmp/ec"


def test_flat_ec_prefixed_keys_and_env_precedence(tmp_path, monkeypatch):
    path = write_yaml(
        tmp_path / "c.yaml", {"ec_max_local_cpu_size": 0.25, "ec_namespace": "tenant-a"}
    )
    monkeypatch.setenv("LMCACHE_EC_MAX_LOCAL_CPU_SIZE", "0.75")
    config = load_config(path)
    assert config.max_local_cpu_size == 0.75
    assert config.namespace == "tenant-a"


def test_dict_source_accepts_section_or_document():
    assert load_config({"max_local_cpu_size": 2}).max_local_cpu_size == 2.0
    assert load_config({"ec": {"max_local_cpu_size": 3}}).max_local_cpu_size == 3.0


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"max_local_cpu_size": -1}, "max_local_cpu_size"),
        ({"max_local_cpu_size": "lots"}, "max_local_cpu_size"),
        ({"local_cpu": "maybe"}, "local_cpu"),
        ({"max_local_disk_size": 0}, "max_local_disk_size"),
        ({"remote_timeout": 0}, "remote_timeout"),
        ({"remote_url": "mooncakestore://127.0.0.1:1"}, "remote_url"),
        ({"remote_url": "resp://127.0.0.1:1"}, "remote_url"),
        ({"remote_url": "no-scheme"}, "remote_url"),
        ({"cache_policy": "random"}, "cache_policy"),
        ({"namespace": ""}, "namespace"),
        ({"no_such_key": 1}, "no_such_key"),
        ({"extra_config": [1, 2]}, "extra_config"),
        ({"remote_serde": "cachegen"}, "remote_serde"),  # would fail at the engine's start
        ({"read_threads": float("inf")}, "read_threads"),  # int(inf) overflows
    ],
)
def test_invalid_values_name_the_key(tmp_path, section, named):
    path = write_yaml(tmp_path / "c.yaml", {"ec": section})
    with pytest.raises(ConfigError, match=named) as info:
        load_config(path)
    assert path in str(info.value)


def test_invalid_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("LMCACHE_EC_LOCAL_CPU", "perhaps")
    with pytest.raises(ConfigError, match="LMCACHE_EC_LOCAL_CPU"):
        load_config()


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("ec: [unclosed")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("ec: [1, 2]")
    with pytest.raises(ConfigError, match="'ec' must be a mapping"):
        load_config(tmp_path / "list.yaml")


def test_to_lmcache_carries_the_tier_settings(tmp_path):
    config = load_config({"max_local_cpu_size": 0.5, "local_disk": str(tmp_path)})
    lmcache = config.to_lmcache()
    assert lmcache.max_local_cpu_size == 0.5
    assert lmcache.local_disk == str(tmp_path.resolve())
    assert lmcache.max_local_disk_size == SCHEMA["max_local_disk_size"].default


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_example_configs_load(path):
    assert load_config(path).source == str(path)


# -- LMCache keys inside ec: ------------------------------------------------------


def test_lmcache_alias_sets_the_lmcache_ec_key(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"ec": {"blocking_timeout_secs": 3}})
    assert load_config(path).remote.timeout == 3.0
    # Both spellings agreeing in one source is fine.
    both = {"blocking_timeout_secs": 4, "remote_timeout": 4}
    assert load_config(write_yaml(tmp_path / "d.yaml", {"ec": both})).remote.timeout == 4.0


def test_alias_from_the_environment_wins_over_the_file(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"ec": {"remote_timeout": 3}})
    config = load_config(path, environ={"LMCACHE_EC_BLOCKING_TIMEOUT_SECS": "0.25"})
    assert config.remote.timeout == 0.25
    # ... and the lmcache-ec key from the environment wins over the alias in the file.
    path = write_yaml(tmp_path / "d.yaml", {"ec": {"blocking_timeout_secs": 3}})
    config = load_config(path, environ={"LMCACHE_EC_REMOTE_TIMEOUT": "0.5"})
    assert config.remote.timeout == 0.5


def test_alias_and_key_disagreeing_in_one_source_is_an_error(tmp_path):
    path = write_yaml(
        tmp_path / "c.yaml", {"ec": {"blocking_timeout_secs": 3, "remote_timeout": 1}}
    )
    with pytest.raises(ConfigError, match=r"blocking_timeout_secs.*remote_timeout") as info:
        load_config(path)
    assert path in str(info.value)


def test_aliased_values_are_validated_under_the_alias_name(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"ec": {"blocking_timeout_secs": -1}})
    with pytest.raises(ConfigError, match="blocking_timeout_secs"):
        load_config(path)


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("lookup_timeout_ms", "use remote_timeout"),
        ("local_disk_path_sharding", "use local_disk"),
        ("storage_plugins", "use remote_storage_plugins"),
        ("chunk_size", "no meaning for encoder outputs"),
        ("save_unfull_chunk", "no meaning for encoder outputs"),
        ("pd_role", "no meaning for encoder outputs"),
        ("enable_async_loading", "no meaning for encoder outputs"),
    ],
)
def test_other_lmcache_keys_are_refused_with_a_reason(tmp_path, key, says):
    path = write_yaml(tmp_path / "c.yaml", {"ec": {key: 1}})
    with pytest.raises(ConfigError, match=key) as info:
        load_config(path)
    assert says in str(info.value)
    assert "unknown key" not in str(info.value)


def test_every_alias_is_documented():
    document = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    assert ALIASES
    for alias, target in ALIASES.items():
        assert f"| `{alias}` | `{target}` |" in document


def test_loading_a_remote_config_imports_no_client_library():
    code = (
        "import sys\n"
        "from lmcache_ec.config import load_config\n"
        "load_config({'remote_url': 'redis-cluster://127.0.0.1:7000,127.0.0.1:7001'})\n"
        "load_config({'remote_url': 'redis-sentinel://127.0.0.1:26379/main'})\n"
        "load_config({'remote_url': 's3://bucket/prefix'}).to_lmcache()\n"
        "print(sorted(m for m in ('redis', 'boto3', 'botocore') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis-cluster://127.0.0.1", "host:port"),
        ("redis-cluster://127.0.0.1:7000/mymaster", "nodes only"),
        ("redis-sentinel://127.0.0.1:26379", "service_name"),
        ("redis-cluster://127.0.0.1:99999", "remote_url"),
    ],
)
def test_node_list_urls_are_checked_at_load(url, says):
    with pytest.raises(ConfigError, match="remote_url") as info:
        load_config({"remote_url": url})
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("stage_timeout_s", float("nan")),
        ("stage_timeout_s", float("inf")),
        ("max_pending_saves", float("inf")),
        ("max_pending_saves", -1),
        ("max_inflight_items", 0),  # not one prefetch at a time: none
    ],
)
def test_connector_options_refuse_what_is_not_a_finite_number_at_least_zero(name, value):
    from lmcache_ec.integration.vllm.connector_options import ConnectorSettings

    with pytest.raises(ConfigError, match=f"ec_connector_extra_config.{name}"):
        ConnectorSettings.from_extra_config({name: value})


# -- what a file may get wrong: refused, naming the key and where it came from ---


@pytest.mark.parametrize("key", [n for n, o in SCHEMA.items() if o.default is not None])
def test_a_key_left_empty_is_an_error_unless_its_default_is_unset(tmp_path, key):
    """``namespace:`` (YAML null) would skip the key's check and replace its default."""
    path = tmp_path / "c.yaml"
    path.write_text(f"ec:\n  {key}:\n")
    with pytest.raises(ConfigError, match=f"ec.{key}: '{key}' must be set"):
        load_config(str(path))


def test_a_key_left_empty_whose_default_is_unset_stays_unset(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ec:\n  local_disk:\n  remote_url:\n  timeline_path:\n")
    config = load_config(str(path))
    assert config.local_disk is None and config.remote.url is None
    assert config.timeline_path is None


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"close_timeout": 1e300}, "at most 86400"),  # would overflow doctor's thread waits
        ({"remote_timeout": 1e300}, "at most 86400"),
        ({"remote_retry_interval": 86401}, "at most 86400"),
        ({"purge_check_s": 1e10}, "at most 86400"),
        ({"min_residency_s": 1e300}, "at most 86400"),
        ({"read_threads": 10**6}, "at most 256"),
        ({"max_local_cpu_size": 1e-12}, "at least one byte"),  # a pool of 0 bytes
        ({"max_local_disk_size": 1e-12}, "at least one byte"),
    ],
)
def test_values_past_any_use_are_refused(tmp_path, section, says):
    path = write_yaml(tmp_path / "c.yaml", {"ec": section})
    (name,) = section
    with pytest.raises(ConfigError, match=f"ec.{name}: '{name}' must be {says}"):
        load_config(path)


def test_the_largest_values_taken_are_usable():
    config = load_config({"close_timeout": 86400, "remote_timeout": 86400, "read_threads": 256})
    assert config.close_timeout == 86400 and config.read_threads == 256


@pytest.mark.parametrize(
    ("section", "shown"),
    [
        ({"remote_url": ["redis://u:s3cret@h:1"]}, "redis://u:***@h:1"),
        ({"s3_endpoint_url": ["http://key:s3cret@minio:9000"]}, "http://key:***@minio:9000"),
        ({"remote_url": "redis://u:s3cret@h:6379x"}, "'remote_url'"),
        # A '/', '?' or '#' in a password ends the host part: the parser takes
        # the password for the port, and its error would repeat it.
        ({"remote_url": "redis://default:s3cret/Kp2+w==@h:6379/0"}, "percent-encoded"),
        ({"remote_url": "rediss://admin:s3cret#x@h:6380"}, "percent-encoded"),
        ({"s3_endpoint_url": "http://minio:s3cret/abc@minio:9000"}, "percent-encoded"),
    ],
)
def test_a_config_error_never_shows_a_password(tmp_path, section, shown):
    path = write_yaml(tmp_path / "c.yaml", {"ec": section})
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "s3cret" not in str(info.value) and shown in str(info.value)


def test_a_local_disk_of_several_directories_names_where_it_came_from(tmp_path):
    with pytest.raises(ConfigError, match="LMCACHE_EC_LOCAL_DISK: 'local_disk' takes one"):
        load_config({}, environ={"LMCACHE_EC_LOCAL_DISK": "/data/a,/data/b"})
    path = write_yaml(tmp_path / "c.yaml", {"ec": {"local_disk": "/data/a,/data/b"}})
    with pytest.raises(ConfigError, match=f"{path} ec.local_disk: 'local_disk' takes one"):
        load_config(path)


def test_the_ec_section_is_found_in_any_letter_case(tmp_path):
    """As top-level ``EC_LOCAL_DISK`` is: an ``EC:`` section is never silently ignored."""
    path = write_yaml(tmp_path / "c.yaml", {"EC": {"local_disk": str(tmp_path / "store")}})
    assert load_config(path).local_disk == str(tmp_path / "store")
    path = write_yaml(tmp_path / "d.yaml", {"Ec": {"bogus_key": 1}})
    with pytest.raises(ConfigError, match=r"Ec\.bogus_key: unknown key"):
        load_config(path)
    path = write_yaml(tmp_path / "e.yaml", {"ec": {}, "EC": {}})
    with pytest.raises(ConfigError, match="both name the 'ec' section"):
        load_config(path)


def test_cache_policy_claims_only_the_tier_it_governs():
    """The disk and node tiers evict by modification time whatever ``cache_policy`` says."""
    assert SCHEMA["cache_policy"].help.startswith("Eviction policy of the CPU tier.")
