"""An entry never costs more than it declares.

A frame's stored size must equal its prefix + header + payload; a value padded
beyond that (a sparse tail on disk, a long value in Redis or S3) is a damaged
entry: a counted miss, removed. Reads are sized from the declared length, so
the padding is never read into memory: each test measures what the read
allocated (``tracemalloc`` traces numpy's arrays and Python's bytes) and
bounds it far below the padding.
"""

from __future__ import annotations

import os
import time
import tracemalloc

import torch

from tests.conftest import make_tensor
from tests.faults.checks import get_checked, put_checked, snapshot
from tests.faults.stores import RawRemote, disk_path
from tests.remote.conftest import remote_config

MODEL = "test/padding"
ENTRY = (64, 64)  # float32: a 16 KiB payload
MiB = 1 << 20
# What a bounded read of a 16 KiB entry may allocate (the CPU pool of the remote
# tests is 1 MiB: a Redis read takes at most that plus one byte), far below the tails.
BOUND = 4 * MiB


def _peak_of(action):
    """``action()``'s result and the peak of traced allocations while it ran."""
    tracemalloc.start()
    try:
        result = action()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _quiet(cache) -> None:
    """Wait for the purge watch's first look at the remote tier: its client is
    built then (botocore loads its service model), on its own thread, and would
    count in the traced peak."""
    deadline = time.monotonic() + 30
    while not cache._purges.watch.remote_checked:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _body_reads(cache) -> list[int]:
    """Bytes of each read from an S3 response body by ``cache``'s remote store, from now."""
    store = cache._storage.storage_backends["RemoteBackend"].connection
    client = store.getWrappedConnector().store._client
    taken: list[int] = []
    get_object = client.get_object

    def recording_get_object(**kwargs):
        response = get_object(**kwargs)
        read = response["Body"].read

        def recording_read(*args):
            data = read(*args)
            taken.append(len(data))
            return data

        response["Body"].read = recording_read
        return response

    client.get_object = recording_get_object
    return taken


def test_padded_disk_entry_is_a_counted_miss_and_its_tail_is_never_read(disk_dir, make_cache):
    tensor = make_tensor(ENTRY, torch.float32, seed=1)
    config = {"local_cpu": False, "max_local_cpu_size": 0.05, "local_disk": str(disk_dir)}
    cache = make_cache(config, model=MODEL, dtype=torch.float32)
    assert put_checked(cache, "img", tensor)
    assert cache.flush(10)
    path = disk_path(disk_dir, cache.key("img"))
    size = path.stat().st_size
    os.truncate(path, size + 256 * MiB)  # a sparse 256 MiB tail
    hit, peak = _peak_of(lambda: get_checked(cache, "img", tensor))
    assert not hit
    assert peak < BOUND, peak
    assert snapshot(cache)["integrity_failures"] == 1
    assert not path.exists()

    # The promotion path (a read into a CPU-pool buffer) sizes it the same way.
    assert put_checked(cache, "img", tensor)
    assert cache.flush(10)
    os.truncate(path, size + 256 * MiB)
    asked: list[int] = []
    disk = cache._disk
    assert disk.read_into_pool(cache.key("img"), lambda n: asked.append(n)) is None
    assert asked == []  # nothing allocated for a damaged entry
    assert disk.counters["damaged"] == 1
    os.truncate(path, size)  # whole again: read at exactly its size
    buffer = disk.read_into_pool(cache.key("img"), disk._pool_buffer)
    assert buffer is not None and buffer.get_physical_size() >= size
    buffer.ref_count_down()


def test_padded_remote_entry_is_a_counted_miss_and_its_tail_is_never_read(remote, make_cache):
    tensor = make_tensor(ENTRY, torch.float32, seed=2)
    config = remote_config(
        **remote, local_cpu=False, max_local_cpu_size=1 / 1024, purge_check_s=3600
    )
    raw = RawRemote(remote["url"], remote.get("endpoint"))
    try:
        with make_cache(config, model=MODEL, dtype=torch.float32) as writer:
            assert put_checked(writer, "img", tensor)
            assert put_checked(writer, "warm-up", tensor)
            assert writer.flush(10)
            name = writer.key("img").storage_name
        frame = raw.get(name)
        tail = 32 * MiB if raw.kind == "redis" else 8 * MiB
        raw.set(name, frame + bytes(tail))
        with make_cache(config, model=MODEL, dtype=torch.float32) as cache:
            _quiet(cache)
            # A first read builds what the client builds once (botocore's response model).
            assert get_checked(cache, "warm-up", tensor)
            if raw.kind == "s3":
                # moto serves from this process: traced allocations would include its
                # own copy of the object, so count the bytes taken from the response.
                taken = _body_reads(cache)
                assert not get_checked(cache, "img", tensor)
                assert 0 < sum(taken) <= len(frame) + 1, taken
            else:
                hit, peak = _peak_of(lambda: get_checked(cache, "img", tensor))
                assert not hit
                assert peak < BOUND, peak
            assert snapshot(cache)["integrity_failures"] == 1
        assert raw.get(name) is None  # removed
    finally:
        raw.close()
