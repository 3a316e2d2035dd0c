"""ECCache.get_or_compute across instances sharing a remote tier (Redis, S3).

Real servers; each cache is its own instance (own store clients, own claim
owner). A dead holder is a process killed holding its claim; a store that
goes down is a redis-server killed while a caller waits on a claim in it.
"""

from __future__ import annotations

import functools
import multiprocessing
import time

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.config import load_config
from lmcache_ec.remote.redis_store import CLAIM
from lmcache_ec.remote.store import open_store
from lmcache_ec.remote_names import claim_key, redis_data_key
from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import outage_config, redis_requests, remote_config
from tests.test_get_or_compute import (
    DTYPE,
    NEVER_S,
    SHAPE,
    Computation,
    finished,
    in_thread,
    waiting_on_another,
)


@pytest.fixture
def open_cache(make_cache):
    return functools.partial(make_cache, model="test/get-or-compute", dtype=DTYPE)


def test_an_instance_loads_what_another_computes(remote, open_cache):
    config = remote_config(**remote)
    with open_cache(config) as first, open_cache(config) as second:
        holding = Computation(seed=1, hold=True)
        holder, held = in_thread(lambda: first.get_or_compute("img", holding, wait_s=NEVER_S))
        assert holding.started.wait(60)
        waiting = Computation(seed=2)
        waiter, waited = in_thread(
            lambda: second.get_or_compute_many(
                ["img", "other"], lambda hashes: [waiting() for _ in hashes], wait_s=NEVER_S
            )
        )
        assert waiting_on_another(second)
        holding.go.set()
        assert finished(holder) and finished(waiter)
        assert waiting.calls == 1  # "other" only: "img" came from the first instance
        assert bit_equal(waited[0][0], held[0])
        assert bit_equal(waited[0][0], make_tensor(SHAPE, DTYPE, 1))
        assert second.stats.snapshot()["get_or_compute"]["waits_loaded"] == 1


def _hold_a_claim(config: dict, name: str, claimed) -> None:
    """A forked process: claims ``name`` for 600 s, says so, and sleeps until killed."""
    store = open_store(load_config(config).remote)
    if store.claim(name, 600):
        claimed.set()
    time.sleep(600)


def test_a_killed_holder_delays_others_at_most_the_bound(remote, open_cache):
    config = remote_config(**remote)
    with open_cache(config) as cache:
        name = cache.key("orphaned").storage_name
        # Forked: the test process has the store's modules loaded already.
        context = multiprocessing.get_context("fork")
        claimed = context.Event()
        holder = context.Process(target=_hold_a_claim, args=(config, name, claimed), daemon=True)
        holder.start()
        try:
            assert claimed.wait(60)
        finally:
            holder.kill()
            holder.join(30)
        compute = Computation(seed=3)
        thread, out = in_thread(lambda: cache.get_or_compute("orphaned", compute, wait_s=0.3))
        assert finished(thread)
        assert compute.calls == 1 and bit_equal(out[0], make_tensor(SHAPE, DTYPE, 3))
        assert cache.stats.snapshot()["get_or_compute"]["waits"] == 1


def test_a_store_going_down_mid_wait_falls_back_to_computing(redis_process, open_cache):
    config = outage_config(redis_process.url)
    other = open_store(load_config(config).remote)
    with open_cache(config) as cache:
        name = cache.key("stranded").storage_name
        assert other.claim(name, 600)  # a live holder that will never deliver
        compute = Computation(seed=4)
        thread, out = in_thread(lambda: cache.get_or_compute("stranded", compute, wait_s=NEVER_S))
        assert waiting_on_another(cache)
        redis_process.kill()
        assert finished(thread)  # not after NEVER_S
        assert compute.calls == 1 and bit_equal(out[0], make_tensor(SHAPE, DTYPE, 4))
    other.close()


def test_a_hostile_result_stores_nothing_in_the_shared_tier(remote, open_cache):
    config = remote_config(**remote)
    with open_cache(config) as first, open_cache(config) as second:
        bad = make_tensor(SHAPE, torch.float16)
        try:
            first.get_or_compute("hostile", lambda: bad, wait_s=NEVER_S)
        except ValueError as exc:
            assert "dtype float16" in str(exc)
        else:
            raise AssertionError("a wrong dtype was accepted")
        assert first.flush(30)
        assert second.get("hostile") is None
        good = Computation(seed=5)
        thread, _ = in_thread(lambda: second.get_or_compute("hostile", good, wait_s=NEVER_S))
        assert finished(thread) and good.calls == 1


def _carried(requests: list[bytes], marker: bytes, keys: dict[str, bytes]) -> list[set[str]]:
    """For each request holding ``marker`` and one of ``keys`` (name → its key
    in Redis): the names whose keys it carries."""
    carried = []
    for request in requests:
        if marker in request:
            names = {name for name, key in keys.items() if key + b"\r\n" in request}
            if names:
                carried.append(names)
    return carried


def _batched_trips(cache: ECCache, hashes: list[str], action) -> tuple[list[set], list[set]]:
    """``action()``'s round trips to Redis that claim and that look up ``hashes``:
    for each, the hashes it carried."""
    names = {h: cache.key(h).storage_name for h in hashes}
    with redis_requests() as sent:
        action()
    claimed = {h: claim_key(n).encode() for h, n in names.items()}
    read = {h: redis_data_key(n).encode() for h, n in names.items()}
    return _carried(sent, CLAIM.sha.encode(), claimed), _carried(sent, b"GETRANGE", read)


def _compute_many(hashes: list[str]) -> list[torch.Tensor]:
    return [make_tensor(SHAPE, DTYPE, 50) for _ in hashes]


def test_the_batched_form_claims_any_number_of_new_keys_in_one_round_trip(redis_url, open_cache):
    with open_cache(remote_config(redis_url)) as cache:
        cache.get_or_compute("opening", Computation())  # connections opened, scripts loaded
        trips = {}
        for count in (2, 20):
            hashes = [f"new-{count}-{i}" for i in range(count)]
            claims, lookups = _batched_trips(
                cache, hashes, lambda h=hashes: cache.get_or_compute_many(h, _compute_many)
            )
            assert claims == [set(hashes)]  # one claim round trip for the whole list
            assert lookups and all(carried == set(hashes) for carried in lookups)
            trips[count] = (len(claims), len(lookups))
        assert trips[2] == trips[20]  # lookups too: as many for 20 keys as for 2
        assert cache.stats.snapshot()["get_or_compute"]["computes"] == 23


def test_a_batched_wait_claims_and_looks_up_every_key_in_one_round_trip_a_look(
    redis_url, open_cache
):
    config = remote_config(redis_url)
    with open_cache(config) as cache:
        hashes = [f"held-{i}" for i in range(20)]
        holder = open_store(load_config(config).remote)  # another instance, never delivering
        assert all(holder.claim_many([cache.key(h).storage_name for h in hashes], 600))
        claims, lookups = _batched_trips(
            cache, hashes, lambda: cache.get_or_compute_many(hashes, _compute_many, wait_s=0.3)
        )
        holder.close()
        stats = cache.stats.snapshot()["get_or_compute"]
        assert (stats["waits"], stats["computes"]) == (20, 20)  # waited out the bound
        # The first claim and the claims asked again while waiting, each for all 20;
        # the lookup before claiming and one per look, each for all 20.
        assert len(claims) >= 2 and all(carried == set(hashes) for carried in claims)
        assert len(lookups) >= 3 and all(carried == set(hashes) for carried in lookups)
