"""S3 answers that are not the stored object, and credentials that change.

A gateway or proxy between the cache and S3 may answer a read with an error
page (status 200), another object's bytes, or a cut body with its own length.
Each is a miss, and the good entry stays in the bucket: deleting it would cost
every instance sharing it. Damage in the stored object itself is still removed
(``tests/faults/test_corruption.py``). A throttled call (``SlowDown``) is a
miss, not an outage; a store that refuses every read stays down, rather than
coming back at each probe. A credentials file rewritten while the tier is down
(rotated keys, a refreshed token) is used by its next probe.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch

from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import outage_config, remote_config
from tests.servers import Gateway

MODEL = "test/s3-answers"
LIVENESS = 20.0  # only ever reached when the behaviour is missing: never a timing bound


def _remote(cache):
    return cache._storage.storage_backends["RemoteBackend"]


@pytest.mark.parametrize("answer", ["error-page", "another-entry", "cut-body"])
def test_an_answer_that_is_not_the_stored_entry_is_a_miss_and_the_entry_stays(
    s3_server, s3_bucket, make_cache, answer
):
    url = f"s3://{s3_bucket}/ec"
    tensors = {f"img-{i}": make_tensor((64, 64), torch.float16, seed=i) for i in range(2)}
    with make_cache(remote_config(url, endpoint=s3_server.endpoint), model=MODEL) as writer:
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
        names = {h: writer.key(h).storage_name for h in tensors}
    path = {h: f"/{s3_bucket}/ec/{names[h]}" for h in tensors}
    stored = s3_server.client().get_object(Bucket=s3_bucket, Key=f"ec/{names['img-0']}")
    body = stored["Body"].read()
    replies = {
        "error-page": (200, {"Content-Type": "text/html"}, b"<html>gateway busy</html>"),
        "another-entry": path["img-1"],
        "cut-body": (
            200,
            {"Content-Type": "application/octet-stream", "ETag": stored["ETag"]},
            body[: len(body) // 2],
        ),
    }

    def route(method: str, where: str, headers: dict[str, str]):
        return replies[answer] if method == "GET" and where == path["img-0"] else None

    gateway = Gateway(s3_server.endpoint, route)
    try:
        config = remote_config(url, endpoint=gateway.endpoint, local_cpu=False)
        with make_cache(config, model=MODEL) as reader:
            assert reader.get("img-0") is None
            damaged = reader.stats.snapshot()["integrity_failures"]
            # An error page is the store failing a call, not damage in an entry.
            assert damaged == (0 if answer == "error-page" else 1)
    finally:
        gateway.close()
    kept = s3_server.client().head_object(Bucket=s3_bucket, Key=f"ec/{names['img-0']}")
    assert kept["ETag"] == stored["ETag"]
    with make_cache(remote_config(url, endpoint=s3_server.endpoint), model=MODEL) as later:
        assert bit_equal(later.get("img-0"), tensors["img-0"])


def test_credentials_rewritten_while_the_tier_is_down_are_used_by_its_probe(
    s3_server, s3_bucket, make_cache, monkeypatch, tmp_path
):
    credentials = tmp_path / "credentials"

    def use(key_id: str) -> None:
        credentials.write_text(
            f"[default]\naws_access_key_id = {key_id}\naws_secret_access_key = secret\n"
        )

    use("EXPIREDKEY")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    expired = (
        403,
        {"Content-Type": "application/xml"},
        b"<Error><Code>ExpiredToken</Code><Message>The token has expired.</Message></Error>",
    )

    def route(method: str, where: str, headers: dict[str, str]):
        signed = headers.get("Authorization", "")
        return expired if "Credential=EXPIREDKEY/" in signed else None

    gateway = Gateway(s3_server.endpoint, route)
    try:
        url = f"s3://{s3_bucket}/ec"
        with make_cache(outage_config(url, endpoint=gateway.endpoint), model=MODEL) as cache:
            remote = _remote(cache)
            assert cache.get("img") is None  # refused: the tier is down
            assert not remote.available
            use("ROTATEDKEY")
            deadline = time.monotonic() + LIVENESS
            while not remote.available:
                assert time.monotonic() < deadline, "the probe kept the old credentials"
                time.sleep(0.05)
            tensor = make_tensor((8, 32), torch.float16)
            assert cache.put("img", tensor)
            assert cache.flush(10)
        name = f"ec/{cache.key('img').storage_name}"
        assert s3_server.client().head_object(Bucket=s3_bucket, Key=name)["ContentLength"] > 0
    finally:
        gateway.close()


def _xml_error(status: int, code: str) -> tuple[int, dict[str, str], bytes]:
    body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
    return status, {"Content-Type": "application/xml"}, body


def test_a_throttled_read_is_a_miss_and_the_tier_stays_available(
    s3_server, s3_bucket, make_cache, caplog
):
    url = f"s3://{s3_bucket}/ec"
    tensor = make_tensor((16, 32), torch.float16)
    with make_cache(remote_config(url, endpoint=s3_server.endpoint), model=MODEL) as writer:
        assert writer.put("img", tensor)
        assert writer.flush(10)
        path = f"/{s3_bucket}/ec/{writer.key('img').storage_name}"
    throttled = [True]

    def route(method: str, where: str, headers: dict[str, str]):
        refused = throttled[0] and method == "GET" and where == path
        return _xml_error(503, "SlowDown") if refused else None

    caplog.set_level(logging.WARNING, logger="lmcache_ec")
    gateway = Gateway(s3_server.endpoint, route)
    try:
        config = remote_config(url, endpoint=gateway.endpoint, local_cpu=False)
        with make_cache(config, model=MODEL) as reader:
            remote = _remote(reader)
            assert reader.get("img") is None
            assert remote.available  # asked to slow down: not an outage
            assert remote.counters["busy_misses"] == 1
            throttled[0] = False
            assert bit_equal(reader.get("img"), tensor)
    finally:
        gateway.close()
    said = [r.getMessage() for r in caplog.records]
    assert sum("S3 refused 1 call(s) for now (SlowDown)" in line for line in said) == 1
    assert not any("unavailable" in line for line in said)


def test_a_store_refusing_every_read_stays_down_and_says_so_once(
    s3_server, s3_bucket, make_cache, caplog
):
    """The bucket answers (HeadBucket) but every object read is denied (a policy
    on the wrong prefix): the tier stays down, one WARNING, instead of coming
    back at each probe and going down at the next read."""
    url = f"s3://{s3_bucket}/ec"
    denied = _xml_error(403, "AccessDenied")

    def route(method: str, where: str, headers: dict[str, str]):
        reads_object = method in ("GET", "HEAD") and where.startswith(f"/{s3_bucket}/ec/")
        return denied if reads_object else None

    caplog.set_level(logging.WARNING, logger="lmcache_ec")
    gateway = Gateway(s3_server.endpoint, route)
    try:
        config = outage_config(url, endpoint=gateway.endpoint, local_cpu=False)
        with make_cache(config, model=MODEL) as reader:
            remote = _remote(reader)
            for _ in range(10):  # reads over several probe intervals
                assert reader.get("img") is None
                time.sleep(0.1)
            assert not remote.available
    finally:
        gateway.close()
    said = [r.getMessage() for r in caplog.records]
    assert sum("unavailable" in line for line in said) == 1
    assert not any("available again" in line for line in said)
