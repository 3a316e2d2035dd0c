"""The ec: section: sources, precedence, validation errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lmcache_ec.config import SCHEMA, ConfigError, load_config

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
    assert load_config(path).values
