"""Sharing through the remote tier: one process writes, another reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from lmcache_ec.config import load_config
from lmcache_ec.remote.catalog import open_catalog
from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import frames_sent_in_place, remote_config
from tests.remote.reader_proc import fingerprint
from tests.servers import REDIS_PASSWORD

REPO = Path(__file__).resolve().parents[2]
MODEL = "test/remote-model"
SHAPES = [(1, 8), (3, 64), (17, 100), (256, 33)]  # odd sizes: frames of arbitrary length
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _entries(n: int) -> dict[str, torch.Tensor]:
    return {
        f"img-{i}": make_tensor(SHAPES[i % len(SHAPES)], DTYPES[i % len(DTYPES)], seed=i)
        for i in range(n)
    }


def _read_in_other_process(config: dict, hashes: list[str]) -> dict:
    request = json.dumps({"config": config, "model": MODEL, "hashes": hashes})
    done = subprocess.run(
        [sys.executable, "-m", "tests.remote.reader_proc"],
        input=request,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "LMCACHE_LOG_LEVEL": "WARNING"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_process_b_reads_everything_process_a_wrote(remote, tmp_path, make_cache):
    entries = _entries(12)
    writer_config = remote_config(**remote, local_disk=str(tmp_path / "a-disk"))
    with make_cache(writer_config, model=MODEL) as writer:
        assert all(writer.put_many(entries))
        assert writer.flush(30)

    reader_config = remote_config(**remote, local_disk=str(tmp_path / "b-disk"))
    answer = _read_in_other_process(reader_config, list(entries))
    assert [r["tier"] for r in answer["results"]] == ["remote"] * len(entries)
    assert [r["fingerprint"] for r in answer["results"]] == [
        fingerprint(t) for t in entries.values()
    ]
    assert answer["hits"] == {"remote": len(entries)}


def test_remote_hit_is_promoted_to_local_tiers(remote, tmp_path, make_cache):
    tensor = make_tensor((5, 40), torch.bfloat16)
    with make_cache(remote_config(**remote), model=MODEL) as writer:
        writer.put("x", tensor)
        assert writer.flush(10)
    config = remote_config(**remote, local_disk=str(tmp_path / "disk"))
    reader = make_cache(config, model=MODEL)
    assert reader.contains("x") == "remote"
    assert bit_equal(reader.get("x"), tensor)
    assert reader.flush(10)
    assert reader.contains("x") == "cpu"
    assert bit_equal(reader.get("x"), tensor)
    assert reader.stats.snapshot()["hits"] == {"remote": 1, "cpu": 1}
    assert (tmp_path / "disk" / f"{reader.key('x').storage_name}.pt").exists()


def _set_calls(remote: dict) -> int:
    if not remote["url"].startswith("redis"):
        return 0
    import redis

    stats = redis.Redis.from_url(remote["url"]).info("commandstats")
    return stats.get("cmdstat_set", {}).get("calls", 0)


def test_put_of_a_stored_key_is_not_uploaded_again(remote, make_cache):
    tensor = make_tensor((4, 16), torch.float16)
    with make_cache(remote_config(**remote), model=MODEL) as first:
        first.put("dup", tensor)
        assert first.flush(10)
        assert first._storage.storage_backends["RemoteBackend"].counters["uploads"] == 1
    writes_before = _set_calls(remote)
    # Another instance (empty local tiers) computes the same output and puts it.
    with make_cache(remote_config(**remote), model=MODEL) as second:
        assert second.put("dup", tensor)
        assert second.flush(10)
        counters = second._storage.storage_backends["RemoteBackend"].counters
        assert counters["uploads"] == 0
        assert counters["upload_skipped_existing"] == 1
    assert _set_calls(remote) == writes_before


def test_upload_sends_the_staged_frame_in_place_without_waking_the_event_loop(remote, make_cache):
    """A put only queues its upload on the store's threads. A hop through
    LMCache's event loop would wake it with a socket write, handing it the
    GIL in the middle of the caller's put; a private copy of the frame would
    cost a second pass over its bytes. The staging buffer is freed once sent."""
    tensor = make_tensor((64, 256), torch.bfloat16)
    config = remote_config(**remote, local_cpu=False)
    with make_cache(config, model=MODEL) as cache:
        backend = cache._storage.storage_backends["RemoteBackend"]
        store = backend.connection.getWrappedConnector().store
        sends = []
        send = store.put

        def recording_send(name: str, data) -> None:
            sends.append((threading.current_thread().name, type(data), cache._cpu.used_bytes()))
            send(name, data)

        wakes = []
        wake = backend.loop.call_soon_threadsafe

        def recording_wake(*args, **kwargs):
            wakes.append(args)
            return wake(*args, **kwargs)

        store.put = recording_send
        backend.loop.call_soon_threadsafe = recording_wake
        with frames_sent_in_place() as packed:
            try:
                assert cache.put("x", tensor)
            finally:
                del backend.loop.call_soon_threadsafe
            assert wakes == []
            assert cache.flush(10)
        [(thread, kind, staged_bytes)] = sends
        assert thread.startswith("ec-remote")
        assert kind is memoryview
        assert staged_bytes >= tensor.numel() * tensor.element_size()
        assert cache._cpu.used_bytes() == 0
        assert backend.counters["uploads"] == 1
        # Redis: the frame went to the socket as that view (not the hiredis packer's copies).
        frame = send.__self__.get(cache.key("x").storage_name)
        assert packed == ([len(frame)] if remote["url"].startswith("redis") else [])
    reader = make_cache(remote_config(**remote), model=MODEL)
    assert bit_equal(reader.get("x"), tensor)


def _corrupt(remote: dict, storage_name: str) -> None:
    if remote["url"].startswith("redis"):
        import redis

        client = redis.Redis.from_url(remote["url"])
        data_key = storage_name + "kv_bytes"
        last = client.strlen(data_key) - 1
        byte = client.getrange(data_key, last, last)
        client.setrange(data_key, last, bytes([byte[0] ^ 0xFF]))
        return
    import boto3

    bucket, _, prefix = remote["url"][len("s3://") :].partition("/")
    client = boto3.client("s3", endpoint_url=remote["endpoint"])
    key = f"{prefix}/{storage_name}"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[-1] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))


def test_corrupt_remote_entry_is_a_miss_and_is_removed(remote, make_cache):
    tensor = make_tensor((9, 24), torch.float32)
    config = remote_config(**remote)
    with make_cache(config, model=MODEL) as writer:
        writer.put("bad", tensor)
        assert writer.flush(10)
        name = writer.key("bad").storage_name
    _corrupt(remote, name)
    catalog = open_catalog(load_config(config))
    assert catalog is not None and catalog.exists(name)
    with make_cache(config, model=MODEL) as reader:
        assert reader.get("bad") is None
        assert reader.stats.snapshot()["integrity_failures"] == 1
        assert reader.contains("bad") is None
    assert not catalog.exists(name)
    catalog.close()


def test_redis_password_in_url(redis_server_auth, make_cache):
    tensor = make_tensor((2, 8), torch.bfloat16)
    good = remote_config(redis_server_auth.url)
    with make_cache(good, model=MODEL) as writer:
        writer.put("secret", tensor)
        assert writer.flush(10)
    with make_cache(good, model=MODEL) as reader:
        assert bit_equal(reader.get("secret"), tensor)
    # Wrong password: a clean miss, never an exception.
    bad_url = redis_server_auth.url.replace(REDIS_PASSWORD, "wrong")
    intruder = make_cache(remote_config(bad_url), model=MODEL)
    assert intruder.get("secret") is None
    assert intruder.contains("secret") is None


@pytest.mark.parametrize("url", ["resp://127.0.0.1:6379", "valkey://127.0.0.1:6379"])
def test_schemes_that_corrupt_encoder_tensors_are_refused(url):
    from lmcache_ec.config import ConfigError

    with pytest.raises(ConfigError, match="refused"):
        load_config({"remote_url": url})


def test_redis_entry_whose_data_was_evicted_is_cleaned_up(redis_url, make_cache):
    import redis

    tensor = make_tensor((3, 12), torch.bfloat16)
    config = remote_config(redis_url)
    with make_cache(config, model=MODEL) as writer:
        writer.put("evicted", tensor)
        assert writer.flush(10)
        name = writer.key("evicted").storage_name
    redis.Redis.from_url(redis_url).delete(name + "kv_bytes")  # as maxmemory eviction would
    with make_cache(config, model=MODEL) as reader:
        assert reader.get("evicted") is None
        assert reader.contains("evicted") is None  # the orphan metadata is gone
        assert reader.put("evicted", tensor)  # so the entry is uploaded again
        assert reader.flush(10)
    third = make_cache(config, model=MODEL)
    assert bit_equal(third.get("evicted"), tensor)
