"""Claims (in-flight announcements) on every store: one holder, expiry, release.

Redis: a script that sets the owner with ``PX`` if free or ours, and one that
deletes only the owner's; S3: conditional put (``If-None-Match: *``), an
expired or own claim replaced with ``If-Match`` on its ETag, a release that
deletes only its own version. Real servers, separate clients.
"""

from __future__ import annotations

import threading
import time

from lmcache_ec.config import load_config
from lmcache_ec.remote.catalog import open_catalog
from tests.remote.conftest import open_stores, outage_config, redis_requests, remote_config

# Long enough for the second client's first call to see the first claim
# unexpired on a loaded 2-core machine (0.4 s was not, once, with moto).
TTL = 1.0


def test_one_holder_until_release(remote):
    first, second = open_stores(**remote)
    try:
        assert first.claim("ec-claim.item-a", 30)
        assert not second.claim("ec-claim.item-a", 30)
        assert first.claim("ec-claim.item-a", 30)  # already ours
        second.release("ec-claim.item-a")  # not its claim: left alone
        assert not second.claim("ec-claim.item-a", 30)
        assert second.claim("ec-claim.item-b", 30)  # other names are independent
        first.release("ec-claim.item-a")
        assert second.claim("ec-claim.item-a", 30)
        second.release("ec-claim.item-a")
        second.release("ec-claim.item-a")  # releasing twice is harmless
    finally:
        first.close()
        second.close()


def test_an_expired_claim_is_taken_by_exactly_one(remote):
    stores = open_stores(**remote, count=4)
    try:
        for store in stores:
            store.ping()  # connected first: the TTL window holds the claims alone
        assert stores[0].claim("ec-claim.item", TTL)
        assert not stores[1].claim("ec-claim.item", TTL)
        time.sleep(TTL + 0.3)
        results: list[bool] = []
        barrier = threading.Barrier(3)

        def contend(store) -> None:
            barrier.wait()
            results.append(store.claim("ec-claim.item", 30))

        threads = [threading.Thread(target=contend, args=(s,)) for s in stores[1:]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(results) == [False, False, True]
        assert not stores[0].claim("ec-claim.item", 30)
    finally:
        for store in stores:
            store.close()


def test_a_slow_holders_release_leaves_anothers_fresh_claim(remote):
    slow, fast, third = open_stores(**remote, count=3)
    try:
        for store in (slow, fast, third):
            store.ping()
        assert slow.claim("ec-claim.item", TTL)
        time.sleep(TTL + 0.3)  # the slow holder's claim expires
        assert fast.claim("ec-claim.item", 30)
        slow.release("ec-claim.item")  # late: the claim is no longer its own
        assert not third.claim("ec-claim.item", 30)
        fast.release("ec-claim.item")
        assert third.claim("ec-claim.item", 30)
    finally:
        for store in (slow, fast, third):
            store.close()


def test_s3_release_racing_a_takeover_deletes_nothing(s3_bucket, s3_server):
    """S3 reads the claim, then deletes it: a takeover in between (the holder's
    claim had expired) fails the delete's ``If-Match``, so the new claim stays."""
    remote = {"url": f"s3://{s3_bucket}/ec-test", "endpoint": s3_server.endpoint}
    slow, fast, third = open_stores(**remote, count=3)
    try:
        assert slow.claim("ec-claim.item", 0.001)  # expired at once
        read = slow._held_claim

        def taken_over_after_the_read(claim):
            found = read(claim)
            assert fast.claim("ec-claim.item", 30)  # the takeover, in the window
            return found

        slow._held_claim = taken_over_after_the_read
        slow.release("ec-claim.item")
        assert not third.claim("ec-claim.item", 30)  # still the fast one's
    finally:
        for store in (slow, fast, third):
            store.close()


def test_the_holder_claiming_again_renews_its_claim(remote):
    first, second = open_stores(**remote)
    try:
        first.ping()
        second.ping()
        assert first.claim("ec-claim.item", TTL)
        assert first.claim("ec-claim.item", 30)  # ours: True, and renewed
        time.sleep(TTL + 0.3)  # past the first claim's expiry
        assert not second.claim("ec-claim.item", 30)
    finally:
        first.close()
        second.close()


def test_claims_are_not_entries(remote):
    (first,) = open_stores(**remote, count=1)
    try:
        assert first.claim("ec-claim.hidden", 30)
        catalog = open_catalog(load_config(remote_config(**remote)))
        with catalog:
            assert list(catalog.list()) == []
            assert not catalog.claim("ec-claim.hidden", 30)
            first.release("ec-claim.hidden")
            assert catalog.claim("ec-claim.hidden", 30)
            catalog.release("ec-claim.hidden")
    finally:
        first.close()


def test_catalog_claim_goes_ahead_when_the_store_cannot_answer(black_hole):
    config = outage_config(f"redis://127.0.0.1:{black_hole.port}")
    with open_catalog(load_config(config)) as catalog:
        assert catalog.claim("ec-claim.item", 30)  # nobody can announce: do the work
        catalog.release("ec-claim.item")


def test_claims_in_an_outage_skip_the_store_until_its_retry_interval(black_hole, caplog):
    """A hung store holds each claim for its timeout, and every claim queued
    behind it: after one failure, claims and releases go ahead without the
    store for ``remote_retry_interval``, with one WARNING for the outage."""
    config = outage_config(f"redis://127.0.0.1:{black_hole.port}", remote_retry_interval=60)
    with open_catalog(load_config(config)) as catalog, caplog.at_level("WARNING"):
        assert catalog.claim("ec-claim.first", 30)  # waits the timeout once
        with redis_requests() as sent:
            assert catalog.claim("ec-claim.second", 30)
            assert catalog.claim_many(["ec-claim.a", "ec-claim.b"], 30) == [True, True]
            catalog.release("ec-claim.first")
        assert sent == []
    warnings = [r for r in caplog.records if r.name == "lmcache_ec.remote.catalog"]
    assert len(warnings) == 1 and "retried every 60 s" in warnings[0].getMessage()


def test_claims_reach_the_store_again_after_an_outage(redis_process, caplog):
    """Past ``remote_retry_interval`` the next claim asks the store again; its
    answer is the store's (another's live claim: False)."""
    config = outage_config(redis_process.url, remote_retry_interval=0.2)
    with open_catalog(load_config(config)) as catalog, caplog.at_level("INFO"):
        redis_process.kill()
        assert catalog.claim("ec-claim.item", 30)  # nobody can answer: do the work
        redis_process.start()
        with open_catalog(load_config(remote_config(redis_process.url))) as holder:
            assert holder.claim("ec-claim.item", 30)
            deadline = time.monotonic() + 30
            while catalog.claim("ec-claim.item", 30) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not catalog.claim("ec-claim.item", 30)
    assert any("answered again" in r.getMessage() for r in caplog.records)


def test_a_claim_never_touches_the_entry_it_names(remote, make_cache):
    """A claim lives beside the entry (``<name>.claim``): claiming and releasing
    the storage name of a stored entry leaves the entry readable and listed."""
    import torch

    from tests.conftest import bit_equal, make_tensor

    tensor = make_tensor((16, 64), torch.float16)
    config = remote_config(**remote)
    with make_cache(config, model="org/claim-model") as cache:
        cache.put("img", tensor)
        cache.flush()
        name = cache.key("img").storage_name
    (store,) = open_stores(**remote, count=1)
    try:
        assert store.exists(name)
        assert store.claim(name, 30)
        assert [n for n, _ in store.list("") if n == name] == [name]
        store.release(name)
        assert store.exists(name)
        data = store.get(name)
        assert data is not None
    finally:
        store.close()
    reader = make_cache(config, model="org/claim-model")
    assert bit_equal(reader.get("img"), tensor)
