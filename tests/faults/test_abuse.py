"""Hostile input: mm_hash strings, tenants sharing stores, oversized tensors, bad YAML.

- A hostile ``mm_hash`` (path traversal, NUL, 1 MB, unicode, shell and RESP
  metacharacters) only ever reaches the SHA-256 digest: no file outside the
  cache directory, only safe Redis keys and S3 object names, exact round trips.
- Tenants sharing a disk directory and a remote never read each other's
  entries, even under the same ``mm_hash``; a copied entry is rejected.
- Tensors larger than a tier: refused with a clear error (CPU tier) or kept
  out of the tier (disk), counted, nothing evicted.
- Malformed configuration is a ``ConfigError`` naming the source, never a
  stray exception from the YAML parser, the OS or torch.
"""

from __future__ import annotations

import random
import re
import shutil
import threading

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.config import ConfigError, load_config
from lmcache_ec.key import ECKey
from tests.conftest import bit_equal, make_tensor
from tests.faults.checks import (
    contains_checked,
    get_checked,
    get_many_checked,
    put_checked,
    snapshot,
)
from tests.faults.stores import RawRemote, disk_path
from tests.remote.conftest import remote_config
from tests.test_key import HOSTILE_MM_HASHES

SHELL_AND_PROTOCOL = [
    "$(touch pwned)",
    "`touch pwned`",
    "; rm -rf / ;",
    "| cat /etc/passwd",
    "&& echo hi > pwned",
    "'\"'\"",
    "*?[a-z]{1,2}~$HOME",
    "%s%n%x%p",
    "{{7*7}}${7*7}",
    "\r\n*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\ny\r\n",  # RESP injection
    "FLUSHALL",
    "<script>alert(1)</script>",
    "\u202e\u200b\ufeff",
    "\U0010ffff" * 64,
]
CORPUS = HOSTILE_MM_HASHES + SHELL_AND_PROTOCOL
SAFE_STORAGE_NAME = re.compile(r"^ec1\.[A-Za-z0-9-]+\.[A-Za-z0-9-]+\.[0-9a-f]{64}$")


def files_under(path) -> set:
    return {p for p in path.rglob("*") if p.is_file()}


def test_hostile_mm_hashes_stay_inside_the_cache_dir(tmp_path, disk_dir, monkeypatch, make_cache):
    monkeypatch.chdir(tmp_path)  # a shell-interpreted name would create ./pwned here
    before = files_under(tmp_path)
    tensors = {h: make_tensor((4, 8), torch.float32, seed=i) for i, h in enumerate(CORPUS)}
    with make_cache(model="../../model", namespace="../ns") as cache:
        for mm_hash, tensor in tensors.items():
            assert cache.put(mm_hash, tensor)
        assert cache.flush()
    created = files_under(tmp_path) - before
    assert len(created) == len(tensors)
    for path in created:
        assert path.parent == disk_dir
        assert ECKey.is_storage_name(path.name.removesuffix(".pt"))
    with make_cache(model="../../model", namespace="../ns") as cache:
        for mm_hash, tensor in tensors.items():
            assert cache.contains(mm_hash) == "disk"
            assert bit_equal(cache.get(mm_hash), tensor)
        # Never-written hostile names are plain misses.
        for mm_hash in CORPUS:
            assert contains_checked(cache, mm_hash + "/../x") is None
            assert not get_checked(cache, mm_hash + "\x00", tensors[mm_hash])
        assert snapshot(cache)["misses"] == len(CORPUS)
    assert not (tmp_path / "pwned").exists()


def test_hostile_mm_hashes_through_the_remote(remote, fault_table, make_cache):
    tensors = {h: make_tensor((4, 8), torch.bfloat16, seed=i) for i, h in enumerate(CORPUS)}
    config = remote_config(**remote)
    with make_cache(config, model="../../model", namespace="$(id)") as writer:
        for mm_hash, tensor in tensors.items():
            assert put_checked(writer, mm_hash, tensor)
        assert writer.flush(30)
    raw = RawRemote(remote["url"], remote.get("endpoint"))
    try:
        stored = raw.stored_keys()
    finally:
        raw.close()
    if raw.kind == "redis":
        names = {re.sub(r"(kv_bytes|metadata)$", "", key) for key in stored}
        assert len(stored) == 2 * len(tensors)
    else:
        names = {key.removeprefix("ec-test/") for key in stored}
        assert len(stored) == len(tensors)
    assert len(names) == len(tensors)
    assert all(SAFE_STORAGE_NAME.match(name) for name in names), names
    with make_cache(config, model="../../model", namespace="$(id)") as reader:
        assert all(get_checked(reader, h, t) for h, t in tensors.items())
        assert snapshot(reader)["hits"] == {"remote": len(tensors)}
    if raw.kind == "s3":
        fault_table(
            f"hostile mm_hash corpus ({len(CORPUS)} strings: traversal, NUL, 1 MB, unicode, "
            "shell, RESP)",
            "only digest-named files/keys/objects; exact round trips on disk, Redis, S3",
            "n/a",
        )


def test_tenants_never_read_each_other(remote, disk_dir, fault_table, make_cache):
    hashes = [f"shared-image-{i}" for i in range(4)] + ["../../etc/x"]
    tenants = {"tenant-a": 0, "tenant-b": 100, "../tenant-b": 200}
    config = {**remote_config(**remote), "local_disk": str(disk_dir)}

    def expected(tenant: str, mm_hash: str) -> torch.Tensor:
        return make_tensor((8, 16), torch.float16, seed=tenants[tenant] + hashes.index(mm_hash))

    for tenant in tenants:
        with make_cache(config, namespace=tenant) as cache:
            for mm_hash in hashes:
                assert put_checked(cache, mm_hash, expected(tenant, mm_hash))
            assert cache.flush(30)

    # Each tenant reads its own tensors, from disk and from the remote alone.
    remote_only = remote_config(**remote)
    for source in (config, remote_only):
        for tenant in tenants:
            with make_cache(source, namespace=tenant) as cache:
                for mm_hash in hashes:
                    assert get_checked(cache, mm_hash, expected(tenant, mm_hash))
        with make_cache(source, namespace="tenant-c") as outsider:
            assert not any(get_checked(outsider, h, expected("tenant-a", h)) for h in hashes)
            assert snapshot(outsider)["misses"] == len(hashes)

    # A's entry copied under B's name (disk) and into B's remote slot: rejected.
    raw = RawRemote(remote["url"], remote.get("endpoint"))
    try:
        with make_cache(config, namespace="tenant-a") as a:
            a_key = a.key(hashes[0])
        with make_cache(config, namespace="tenant-b") as b:
            b_key = b.key(hashes[0])
            shutil.copyfile(disk_path(disk_dir, a_key), disk_path(disk_dir, b_key))
            raw.set(b_key.storage_name, raw.get(a_key.storage_name))
            # A fresh engine: its CPU tier is empty, the read goes to the planted copies.
            assert not get_checked(b, hashes[0], expected("tenant-b", hashes[0]))
            assert snapshot(b)["integrity_failures"] == 1
            assert not disk_path(disk_dir, b_key).exists()
            assert raw.get(b_key.storage_name) is None
    finally:
        raw.close()
    if raw.kind == "s3":
        fault_table(
            "tenants A/B (and '../tenant-b') share disk + remote, same mm_hash",
            "each reads only its own tensors; an outsider misses; A's entry copied into B's "
            "slot is a counted miss, removed",
            "n/a",
        )


def test_entry_larger_than_cpu_tier_is_refused_and_evicts_nothing(fault_table, make_cache):
    with make_cache({"max_local_cpu_size": 2 / 1024}) as cache:  # 2 MB
        small = make_tensor((16, 16), torch.float32)
        assert cache.put("small", small)
        with pytest.raises(ValueError, match="exceeds the CPU tier"):
            cache.put("big", make_tensor((1024, 1024), torch.float32))
        assert cache.contains("big") is None
        assert bit_equal(cache.get("small"), small)
        # put_many refuses the whole batch before storing any of it.
        with pytest.raises(ValueError, match="exceeds the CPU tier"):
            cache.put_many({"first": small, "huge": torch.zeros(2048, 1024)})
        assert cache.contains("first") is None
        # A 1 MB mm_hash is stored in the header: its size counts too.
        with pytest.raises(ValueError, match="exceeds the CPU tier"):
            cache.put("h" * (3 << 20), small)
        assert snapshot(cache)["put_rejected"] == 3
        assert snapshot(cache)["puts"] == 1
    fault_table(
        "tensor larger than the CPU tier",
        "put raises ValueError (documented bad input) before storing; nothing evicted; "
        "put_rejected counts it",
        "n/a",
    )


def test_entry_larger_than_the_disk_tier_stays_in_cpu(disk_dir, make_cache):
    tensor = make_tensor((512, 512), torch.float32)  # 1 MB
    config = {
        "max_local_cpu_size": 4 / 1024,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 0.5 / 1024,  # 512 KB
    }
    cache = make_cache(config)
    assert put_checked(cache, "big", tensor)
    assert cache.flush(10)
    assert contains_checked(cache, "big") == "cpu"
    assert not list(disk_dir.glob("*.pt"))
    assert snapshot(cache)["tiers"]["disk"]["skipped_too_large"] == 1
    assert get_checked(cache, "big", tensor)


def test_batch_larger_than_the_cpu_pool_reads_every_entry(disk_dir, make_cache):
    """get_many of entries totalling 3x the CPU pool (disk hits stage through it)."""
    tensors = {f"img-{i}": make_tensor((256, 512), torch.float32, seed=i) for i in range(6)}
    config = {"local_cpu": False, "max_local_cpu_size": 2 / 1024, "local_disk": str(disk_dir)}
    cache = make_cache(config)
    for name, tensor in tensors.items():  # 512 KB each, 3 MB in all
        assert put_checked(cache, name, tensor)
        assert cache.flush(10)
    assert all(get_many_checked(cache, list(tensors), list(tensors.values())))
    assert snapshot(cache)["hits"] == {"disk": len(tensors)}
    assert snapshot(cache)["tiers"]["disk"].get("read_skipped_no_memory", 0) == 0


MALFORMED = {
    "not-utf8": b"\xff\xfe\x00garbage: [",
    "binary-junk": random.Random(0).randbytes(4096),
    "tab-indent": b"ec:\n\tlocal_cpu: true\n",
    "unclosed-flow": b"ec: {local_cpu: [true\n",
    "top-level-list": b"- a\n- b\n",
    "ec-not-a-mapping": b"ec: [1, 2]\n",
    "python-tag": b"ec: !!python/object/apply:os.system ['touch pwned']\n",
    "infinite-size": b"ec: {max_local_cpu_size: .inf}\n",
    "nan-size": b"ec: {max_local_cpu_size: .nan}\n",
    "absurd-size": b"ec: {max_local_cpu_size: 1e300}\n",
    "negative-size": b"ec: {max_local_disk_size: -1}\n",
    "bool-size": b"ec: {max_local_cpu_size: true}\n",
    "word-timeout": b"ec: {remote_timeout: soon}\n",
    "alias-bomb": (
        b"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nec: {namespace: *c}\n"
    ),
    "deep-nesting": b"ec: " + b"[" * 1200 + b"]" * 1200 + b"\n",
    "unknown-key": b"ec: {max_local_cpu: 1}\n",
    "null-key": b"ec: {~: 1}\n",
    "nul-in-disk-path": b'ec: {local_disk: "/tmp/a\\0b"}\n',
    "unclosed-ipv6-url": b"ec: {remote_url: 'redis://[::1'}\n",
    "refused-scheme": b"ec: {remote_url: 'resp://host:1'}\n",
    "bad-json-extra-config": b"ec: {extra_config: '{bad'}\n",
}


def _event_loops() -> int:
    return sum(t.name == "storage-manager-event-loop" for t in threading.enumerate())


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_yaml_is_a_config_error(name, tmp_path, monkeypatch, fault_table):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "lmcache.yaml"
    path.write_bytes(MALFORMED[name])
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message or "local_disk" in message, message
    loops = _event_loops()
    with pytest.raises(ConfigError):
        ECCache.from_config(path, model="m")
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(path))
    with pytest.raises(ConfigError):
        ECCache.from_config(model="m")
    assert _event_loops() == loops
    assert not (tmp_path / "pwned").exists()
    if name == list(MALFORMED)[-1]:
        fault_table(
            f"malformed configuration ({len(MALFORMED)} YAML files; bad env values)",
            "ConfigError naming the file or key; no engine built, no thread left behind",
            "n/a",
        )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LMCACHE_EC_MAX_LOCAL_CPU_SIZE", "inf"),
        ("LMCACHE_EC_MAX_LOCAL_CPU_SIZE", "1 GB"),
        ("LMCACHE_EC_LOCAL_CPU", "maybe"),
        ("LMCACHE_EC_EXTRA_CONFIG", "[" * 100_000),
        ("LMCACHE_EC_REMOTE_URL", "redis://[::1"),
        ("LMCACHE_CONFIG_FILE", "/nonexistent/\x01/lmcache.yaml"),
    ],
)
def test_malformed_environment_is_a_config_error(variable, value, monkeypatch):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable if variable != "LMCACHE_CONFIG_FILE" else "not"):
        ECCache.from_config(model="m")
