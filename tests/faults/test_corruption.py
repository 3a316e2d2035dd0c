"""Damaged and foreign entries planted in the disk and remote tiers.

Bytes are changed behind the cache's back (``stores.py``): random byte flips,
truncation, frames whose checksums are valid but whose header claims a wrong
shape or dtype, and entries of another key-format version. Every read is the
exact tensor or a miss; a damaged entry is counted (``integrity_failures``)
and removed from the tier that held it, and the slot works again.
"""

from __future__ import annotations

import functools
import os
import random

import pytest
import torch

from lmcache_ec import codec
from lmcache_ec import key as key_module
from lmcache_ec.remote_names import redis_data_key
from tests.conftest import bit_equal, make_tensor
from tests.faults.checks import exact_or_miss, get_checked, put_checked, snapshot
from tests.faults.stores import RawRemote, craft_frame, disk_path
from tests.remote.conftest import remote_config

MODEL = "test/corruption"


def only_file(disk_dir):
    (path,) = disk_dir.glob("*.pt")
    return path


@pytest.mark.parametrize(
    "damage",
    ["flip-payload", "flip-header", "truncate", "truncate-to-prefix", "empty", "garbage"],
)
def test_damaged_file_is_a_miss_and_is_removed(disk_dir, damage, make_cache):
    tensor = make_tensor((256, 2560), torch.bfloat16)
    with make_cache() as cache:
        cache.put("img", tensor)
    path = only_file(disk_dir)
    data = bytearray(path.read_bytes())
    if damage == "flip-payload":
        data[len(data) // 2] ^= 0x01
    elif damage == "flip-header":
        data[80] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) - 1000]
    elif damage == "truncate-to-prefix":
        data = data[:32]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(os.urandom(len(data)))
    path.write_bytes(bytes(data))

    cache = make_cache()
    assert not get_checked(cache, "img", tensor)
    assert not path.exists()
    assert cache.stats.snapshot()["integrity_failures"] == 1
    assert cache.contains("img") is None
    # The slot is usable again.
    assert cache.put("img", tensor)
    assert bit_equal(cache.get("img"), tensor)


def _disk_only(disk_dir) -> dict:
    # No CPU hot cache: every read goes to the file.
    return {"local_cpu": False, "max_local_cpu_size": 0.05, "local_disk": str(disk_dir)}


def test_random_byte_flips_and_truncations_on_disk(disk_dir, fault_table, make_cache):
    """Fuzz one stored frame: each read of a damaged copy is exact or a counted miss."""
    tensor = make_tensor((64, 96), torch.float16, seed=3)
    rng = random.Random(1234)
    with make_cache(_disk_only(disk_dir), model=MODEL, dtype=torch.float16) as cache:
        assert put_checked(cache, "img", tensor)
        assert cache.flush(10)
        path = disk_path(disk_dir, cache.key("img"))
        original = path.read_bytes()
        header_end = codec.PREFIX_SIZE + codec.read_prefix(original)[0]
        misses = hits = 0
        for trial in range(120):
            data = bytearray(original)
            if trial % 4 == 3:  # truncate anywhere, or append junk
                cut = rng.randrange(len(data) + 64)
                data = data[:cut] if cut < len(data) else data + os.urandom(cut - len(data))
            else:
                # Spread flips over prefix, header and payload.
                region = (0, codec.PREFIX_SIZE), (codec.PREFIX_SIZE, header_end), (0, len(data))
                low, high = region[trial % 3]
                for _ in range(rng.randint(1, 8)):
                    data[rng.randrange(low, high)] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
            if get_checked(cache, "img", tensor):
                hits += 1  # the damage missed every checked byte (e.g. reserved prefix bytes)
            else:
                misses += 1
                assert not path.exists()  # a corrupt entry is removed
        assert snapshot(cache)["integrity_failures"] == misses
        assert misses > 100
        # Back to normal: the slot takes a fresh write.
        path.write_bytes(original)
        assert get_checked(cache, "img", tensor)
    fault_table(
        "random byte flips / truncation / junk appended (disk, 120 trials)",
        f"{misses} counted misses (entry removed), {hits} exact hits (damage in unchecked "
        "reserved prefix bytes), 0 wrong tensors",
        "immediate (next put/get)",
    )


def _damage_config(remote: dict) -> dict:
    # remote_config's serving timeout: "the tier stays available" then fails only
    # if the product takes the damage itself for an outage, never a slow answer.
    return remote_config(**remote)


@pytest.fixture
def remote_reader(make_cache, remote):
    """``remote_reader()``: a new engine on the test's remote."""
    return functools.partial(make_cache, _damage_config(remote), model=MODEL, dtype=torch.float32)


REMOTE_DAMAGE = ["flip-payload", "flip-header", "truncate", "empty", "garbage", "prefix-only"]


@pytest.mark.parametrize("damage", REMOTE_DAMAGE)
def test_damaged_remote_entry_is_a_miss_and_is_removed(remote_reader, remote, damage, fault_table):
    tensor = make_tensor((128, 256), torch.float32, seed=5)
    raw = RawRemote(remote["url"], remote.get("endpoint"))
    try:
        with remote_reader() as writer:
            assert put_checked(writer, "img", tensor)
            assert writer.flush(10)
            name = writer.key("img").storage_name
        data = bytearray(raw.get(name))
        if damage == "flip-payload":
            data[-7] ^= 0x40
        elif damage == "flip-header":
            data[codec.PREFIX_SIZE + 3] ^= 0x01
        elif damage == "truncate":
            data = data[: len(data) // 2]
        elif damage == "empty":
            data = bytearray()
        elif damage == "prefix-only":
            data = data[: codec.PREFIX_SIZE]
        else:
            data = bytearray(os.urandom(len(data)))
        raw.set(name, bytes(data))

        with remote_reader() as reader:
            assert not get_checked(reader, "img", tensor)
            state = snapshot(reader)
            assert state["integrity_failures"] == 1
            assert raw.get(name) is None  # removed from the store
            assert state["tiers"]["remote"]["available"] is True  # damage is not an outage
        with remote_reader() as rewriter:  # the slot works again
            assert put_checked(rewriter, "img", tensor)
            assert rewriter.flush(10)
        with remote_reader() as reader:
            assert get_checked(reader, "img", tensor)
    finally:
        raw.close()
    if damage == "empty":
        fault_table(
            f"{raw.kind}: damaged entry (flip, truncation, empty, garbage)",
            "counted miss, entry deleted from the store, tier stays available",
            "immediate (next put/get)",
        )


@pytest.mark.parametrize("remote", ["redis"], indirect=True)
def test_a_redis_key_of_another_type_is_a_counted_miss_and_is_removed(remote_reader, remote):
    """A hash where an entry's string should be (WRONGTYPE to a read) is damage:
    a counted miss, removed; the tier stays available, and the other entries of a
    batch read with it are hits."""
    good, bad = make_tensor((16, 32), torch.float32, seed=1), make_tensor((16, 32), torch.float32)
    raw = RawRemote(remote["url"])
    try:
        with remote_reader() as writer:
            assert put_checked(writer, "good", good)
            assert put_checked(writer, "bad", bad)
            assert writer.flush(10)
            name = writer.key("bad").storage_name
        raw._redis.delete(redis_data_key(name))
        raw._redis.hset(redis_data_key(name), "field", "value")
        with remote_reader() as reader:
            found = reader.get_many(["good", "bad"])
            assert bit_equal(found[0], good)
            assert found[1] is None
            state = snapshot(reader)
            assert state["integrity_failures"] == 1
            assert state["tiers"]["remote"]["available"] is True  # damage is not an outage
            assert raw.get(name) is None  # removed from the store
            assert reader.get("bad") is None
    finally:
        raw.close()


def _crafts(key, dims_tensor: torch.Tensor) -> dict[str, bytes]:
    """Frames with valid checksums and a header that lies (the key pins float32)."""
    return {
        "shape-product-mismatch": craft_frame(key, dims_tensor, shape=[4, 9]),
        "shape-3d": craft_frame(key, dims_tensor, shape=[2, 2, 8]),
        "shape-negative": craft_frame(key, dims_tensor, shape=[-4, -8]),
        "shape-float": craft_frame(key, dims_tensor, shape=[4.0, 8.0]),
        "shape-bool": craft_frame(key, dims_tensor, shape=[True, 32]),
        "shape-strings": craft_frame(key, dims_tensor, shape=["4", "8"]),
        "shape-empty": craft_frame(key, torch.zeros(0, 8)),
        "dtype-not-pinned-one": craft_frame(key, torch.zeros(4, 16, dtype=torch.bfloat16)),
        "dtype-unsupported": craft_frame(key, dims_tensor, tensor_dtype="float64"),
        "another-key": craft_frame(key, dims_tensor, name=key.storage_name[:-1] + "0"),
    }


@pytest.mark.parametrize("tier", ["disk", "redis", "s3"])
def test_wrong_shape_and_dtype_entries_are_rejected(
    tier, disk_dir, request, fault_table, make_cache
):
    """Planted frames whose header lies about shape or dtype: misses, never tensors."""
    expected = make_tensor((4, 8), torch.float32, seed=8)
    if tier == "disk":
        config, raw = _disk_only(disk_dir), None
    else:
        remote = (
            {"url": request.getfixturevalue("redis_url")}
            if tier == "redis"
            else {
                "url": f"s3://{request.getfixturevalue('s3_bucket')}/ec",
                "endpoint": request.getfixturevalue("s3_server").endpoint,
            }
        )
        config, raw = _damage_config(remote), RawRemote(remote["url"], remote.get("endpoint"))
    rejected = []
    try:
        with make_cache(config, model=MODEL, dtype=torch.float32) as cache:
            key = cache.key("img")
            crafts = _crafts(key, expected)
            for kind, frame in crafts.items():
                if raw is None:
                    disk_path(disk_dir, key).write_bytes(frame)
                else:
                    raw.set(key.storage_name, frame)
                failures = snapshot(cache)["integrity_failures"]
                assert not get_checked(cache, "img", expected), kind
                assert snapshot(cache)["integrity_failures"] == failures + 1, kind
                if raw is None:
                    assert not disk_path(disk_dir, key).exists(), kind
                else:
                    assert raw.get(key.storage_name) is None, kind
                rejected.append(kind)
            # A genuine entry in the same slot is served.
            assert put_checked(cache, "img", expected)
            assert cache.flush(10)
            assert get_checked(cache, "img", expected)
    finally:
        if raw is not None:
            raw.close()
    assert rejected == list(crafts)
    if tier == "s3":
        fault_table(
            "wrong-shape / wrong-dtype frames with valid checksums (disk, Redis, S3)",
            f"all {len(rejected)} kinds rejected: counted miss, entry removed",
            "immediate (next put/get)",
        )


def test_entries_of_another_key_format_version(
    disk_dir, redis_url, monkeypatch, fault_table, make_cache
):
    """A v2 writer shares the disk directory and Redis with a v1 reader."""
    config = {**remote_config(redis_url), "local_disk": str(disk_dir), "local_cpu": False}
    tensors = {f"img-{i}": make_tensor((8, 16), torch.bfloat16, seed=i) for i in range(3)}
    raw = RawRemote(redis_url)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(key_module, "KEY_FORMAT_VERSION", 2)
            with make_cache(config, model=MODEL) as future:
                for name, tensor in tensors.items():
                    assert put_checked(future, name, tensor)
                assert future.flush(10)
                v2_names = {future.key(name).storage_name for name in tensors}
        assert all(name.startswith("ec2.") for name in v2_names)
        v2_files = {p.name for p in disk_dir.glob("ec2.*.pt")}
        assert len(v2_files) == len(tensors)

        # Another version's entries have other names: plain misses, left alone.
        with make_cache(config, model=MODEL) as current:
            assert not any(get_checked(current, n, t) for n, t in tensors.items())
            state = snapshot(current)
            assert state["misses"] == len(tensors) and state["integrity_failures"] == 0
        assert {p.name for p in disk_dir.glob("ec2.*.pt")} == v2_files
        assert all(raw.get(name) is not None for name in v2_names)

        # The same bytes under this version's name fail the identity check.
        with make_cache(config, model=MODEL) as current:
            for i, (name, tensor) in enumerate(tensors.items()):
                v1 = current.key(name)
                v2_frame = raw.get(sorted(v2_names)[i])
                if i % 2:
                    raw.set(v1.storage_name, v2_frame)
                else:
                    disk_path(disk_dir, v1).write_bytes(v2_frame)
                assert not get_checked(current, name, tensor)
            # A frame with another format's magic, and LMCache's raw KV bytes.
            other_magic = bytearray(v2_frame)
            other_magic[:8] = b"LMCECv2\x00"
            raw_kv = tensors["img-0"].view(torch.uint8).numpy().tobytes()
            for i, data in enumerate((bytes(other_magic), raw_kv)):
                v1 = current.key(f"img-{i}")
                disk_path(disk_dir, v1).write_bytes(data)
                assert not get_checked(current, f"img-{i}", tensors[f"img-{i}"])
            assert snapshot(current)["integrity_failures"] == len(tensors) + 2
            assert not list(disk_dir.glob("ec1.*.pt"))  # every planted frame was removed
    finally:
        raw.close()
    fault_table(
        "entries written by another key-format version",
        "other names: plain misses, left in place; same bytes under this version's name, "
        "other magic, raw KV bytes: counted misses, removed",
        "n/a",
    )


def test_a_hit_is_exact_after_corruption_elsewhere(disk_dir, make_cache):
    """Damage to one entry never affects the answers for its neighbours."""
    tensors = {f"img-{i}": make_tensor((32, 64), torch.bfloat16, seed=i) for i in range(6)}
    cache = make_cache(_disk_only(disk_dir), model=MODEL)
    for name, tensor in tensors.items():
        assert put_checked(cache, name, tensor)
    assert cache.flush(10)
    victim = disk_path(disk_dir, cache.key("img-2"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    answers = cache.get_many(list(tensors))
    hits = [exact_or_miss(a, t) for a, t in zip(answers, tensors.values(), strict=True)]
    assert hits == [True, True, False, True, True, True]
    assert snapshot(cache)["integrity_failures"] == 1
