"""RemoteCatalog sees what the serving path wrote, with the same naming."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from lmcache_ec import codec
from lmcache_ec.config import load_config
from lmcache_ec.remote.catalog import RemoteCatalogError, open_catalog
from tests.conftest import make_tensor
from tests.remote.conftest import TIMEOUT, outage_config, remote_config
from tests.servers import Drip

MODEL = "test/catalog-model"


def test_no_remote_no_catalog(local_config):
    assert open_catalog(load_config(local_config)) is None


def test_exists_list_header_delete(remote, make_cache):
    config = remote_config(**remote)
    tensors = {f"h{i}": make_tensor((i + 1, 48), torch.bfloat16, seed=i) for i in range(3)}
    with make_cache(config, model=MODEL) as cache:
        cache.put_many(tensors)
        assert cache.flush(10)
        names = {cache.key(h).storage_name: h for h in tensors}
        prefix = cache.identity.storage_prefix
        with make_cache(config, model="another/model") as other:
            other.put("h0", tensors["h0"])
            assert other.flush(10)

    catalog = open_catalog(load_config(config))
    assert catalog is not None
    with catalog:
        listed = dict(catalog.list(prefix))
        assert set(listed) == set(names)
        assert len(list(catalog.list())) == len(names) + 1
        for name, mm_hash in names.items():
            assert catalog.exists(name)
            header = catalog.read_header(name)
            assert header is not None
            assert header["mm_hash"] == mm_hash and header["model"] == MODEL
            assert header["shape"] == list(tensors[mm_hash].shape)
            assert header["tensor_dtype"] == "bfloat16"
            assert listed[name] == header["frame_len"]
        victim = next(iter(names))
        assert catalog.delete(victim)
        assert not catalog.exists(victim)
        assert catalog.read_header(victim) is None
        assert not catalog.delete(victim)
        assert victim not in dict(catalog.list(prefix))
        assert not catalog.exists(prefix + "0" * 64)
        # Batched existence: the same answers, in order, for present and absent names.
        asked = [*names, victim, prefix + "1" * 64]
        expected = [name != victim for name in names] + [False, False]
        assert catalog.lookup_many(asked) == expected
        assert catalog.lookup_many([]) == []


def test_header_longer_than_one_ranged_read(remote, make_cache):
    config = remote_config(**remote)
    long_hash = "m" * 6000  # the full mm_hash lives in the header
    with make_cache(config, model=MODEL) as cache:
        cache.put(long_hash, make_tensor((2, 4), torch.float32))
        assert cache.flush(10)
        name = cache.key(long_hash).storage_name
    with open_catalog(load_config(config)) as catalog:
        header = catalog.read_header(name)
    assert header is not None and header["mm_hash"] == long_hash
    assert header["frame_len"] > codec.PREFIX_SIZE + 6000


class _RangeIgnored(BaseHTTPRequestHandler):
    """An S3-compatible server that answers every GET with the whole object."""

    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args) -> None:
        pass


def test_a_server_ignoring_range_is_read_only_as_far_as_asked(s3_server, s3_bucket, make_cache):
    config = remote_config(f"s3://{s3_bucket}/ec-test", endpoint=s3_server.endpoint)
    long_hash = "m" * 6000  # a header longer than the first ranged read
    with make_cache(config, model=MODEL) as cache:
        cache.put(long_hash, make_tensor((1024, 512), torch.float32))
        assert cache.flush(10)
        name = cache.key(long_hash).storage_name
    with open_catalog(load_config(config)) as catalog:
        _RangeIgnored.body = catalog.store.get(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RangeIgnored)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    try:
        with open_catalog(load_config({**config, "s3_endpoint_url": endpoint})) as catalog:
            whole = _RangeIgnored.body
            assert catalog.store.read_range(name, 0, 100) == whole[:100]
            assert catalog.store.read_range(name, 7000, 10) == whole[7000:7010]
            assert catalog.read_header(name)["mm_hash"] == long_hash
    finally:
        server.shutdown()


def test_unreachable_store_is_bounded(black_hole, aws_env):
    for config in (
        outage_config(f"redis://127.0.0.1:{black_hole.port}"),
        outage_config("s3://bucket/p", endpoint=f"http://127.0.0.1:{black_hole.port}"),
    ):
        with open_catalog(load_config(config)) as catalog:
            name = "ec1.a.b." + "0" * 64
            for call in (catalog.exists, catalog.delete):
                started = time.monotonic()
                assert call(name) is False
                assert time.monotonic() - started < TIMEOUT + 1.5
            started = time.monotonic()
            assert catalog.read_header(name) is None
            assert time.monotonic() - started < 2 * TIMEOUT + 1.5
            try:
                list(catalog.list())
            except RemoteCatalogError:
                pass
            else:
                raise AssertionError("listing an unreachable store must raise")


def _answer_within(bound: float, call, *args):
    """``call(*args)``'s result or exception; fails if it still runs after ``bound``."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(result=_outcome(call, *args)), daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"{call.__name__} still reading after {bound} s"
    return box["result"]


def _outcome(call, *args):
    try:
        return call(*args)
    except Exception as exc:
        return exc


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_store_sending_a_byte_at_a_time_holds_no_read_past_the_timeout(kind, aws_env):
    # The purge log and headers are read whole within the timeout: a purge
    # follower or a CLI command is never held by a drip.
    drip = Drip("redis" if kind == "redis" else "http", interval=TIMEOUT / 5)
    if kind == "redis":
        config = outage_config(f"redis://127.0.0.1:{drip.port}")
    else:
        config = outage_config("s3://bucket/p", endpoint=f"http://127.0.0.1:{drip.port}")
    try:
        with open_catalog(load_config(config)) as catalog:
            bound = TIMEOUT + 1.5
            assert _answer_within(bound, catalog.read_header, "ec1.a.b." + "0" * 64) is None
            failure = _answer_within(bound, catalog.read_log, "ec-purge-log", 4096)
            assert isinstance(failure, OSError)
            assert drip.dripping.wait(bound)
    finally:
        drip.close()


def test_a_range_answered_with_an_integer_reads_as_nothing():
    # bytes(n) of a broken server's integer reply would be n zero bytes.
    drip = Drip(
        "redis", interval=TIMEOUT / 5, drip_on=b"NONE", replies={b"GETRANGE": b":4194304\r\n"}
    )
    try:
        with open_catalog(load_config(outage_config(f"redis://127.0.0.1:{drip.port}"))) as catalog:
            assert catalog.store.read_range("ec1.a.b." + "0" * 64, 0, 4096) == b""
            assert catalog.read_log("ec-purge-log", 4096) is None
    finally:
        drip.close()
