"""Reads and writes keyed under one identity, whatever ``set_identity`` does meanwhile.

- ``get_or_compute`` reads under the identity the call started with: its
  lookup and its wait for another instance never return the entry of an
  identity ``set_identity`` set meanwhile (another model's output, of another
  dtype and shape).
- ``put`` / ``put_many`` check a tensor against the identity of the key it is
  stored under: one ``set_identity`` landing between the two never stores a
  frame whose dtype differs from its key's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lmcache_ec.key import ECKey, EncoderIdentity
from tests.conftest import bit_equal, make_tensor
from tests.test_get_or_compute import (
    JOIN_S,
    NEVER_S,
    Computation,
    finished,
    in_thread,
    waiting_on_another,
)

SHAPE, DTYPE = (16, 64), torch.bfloat16  # Computation's
OTHER_SHAPE = (3, 8)


@pytest.fixture
def open_cache(make_cache):
    """An instance of one model (``Computation``'s dtype); instances share one disk directory."""
    return lambda: make_cache(model="test/identity", dtype=DTYPE)


def _another_models(cache) -> EncoderIdentity:
    """Another model's identity in ``cache``'s namespace, of another dtype."""
    return dataclasses.replace(cache.identity, model="test/other", dtype="float32")


def _stored_under(cache, identity: EncoderIdentity, mm_hash: str) -> torch.Tensor:
    """Store another model's output of ``mm_hash`` under ``identity``; the
    cache's identity is left as it was."""
    before = cache.identity
    tensor = make_tensor(OTHER_SHAPE, torch.float32, 9)
    cache.set_identity(identity)
    assert cache.put(mm_hash, tensor)
    cache.set_identity(before)
    return tensor


def _switching_on_first_key(cache, to: EncoderIdentity) -> EncoderIdentity:
    """``cache``'s identity, but the first key made under it sets ``to``: a
    ``set_identity`` from another thread landing right after that key is made."""
    switched: list[bool] = []

    class Switching(EncoderIdentity):
        def key(self, mm_hash: str) -> ECKey:
            key = super().key(mm_hash)
            if not switched:
                switched.append(True)
                cache.set_identity(to)
            return key

    return Switching(**cache.identity.as_dict())


def test_a_lookup_begun_before_set_identity_never_returns_the_new_identitys_entry(open_cache):
    cache = open_cache()
    other = _another_models(cache)
    _stored_under(cache, other, "image")
    cache.set_identity(_switching_on_first_key(cache, other))
    computed = make_tensor(SHAPE, DTYPE, 1)
    got = cache.get_or_compute("image", lambda: computed, wait_s=NEVER_S)
    assert cache.identity == other  # the switch landed inside the call
    assert got.dtype == DTYPE and bit_equal(got, computed)


def test_a_wait_across_set_identity_loads_the_holders_output_not_the_new_identitys(open_cache):
    holder_cache, waiter_cache = open_cache(), open_cache()
    other = _another_models(waiter_cache)
    _stored_under(waiter_cache, other, "image")
    holding = Computation(seed=1, hold=True)
    holder, held = in_thread(lambda: holder_cache.get_or_compute("image", holding, wait_s=NEVER_S))
    assert holding.started.wait(JOIN_S)  # the holder computes under its claim
    waiting = Computation(seed=2)
    waiter, waited = in_thread(
        lambda: waiter_cache.get_or_compute("image", waiting, wait_s=NEVER_S)
    )
    assert waiting_on_another(waiter_cache)
    waiter_cache.set_identity(other)  # new weights while the call waits
    holding.go.set()
    assert finished(holder) and finished(waiter)
    assert waiting.calls == 0  # loaded, not computed
    assert waited[0].shape == SHAPE and bit_equal(waited[0], held[0])
    assert bit_equal(held[0], make_tensor(SHAPE, DTYPE, 1))


@pytest.mark.parametrize(
    "store",
    [
        pytest.param(lambda cache, h, t: cache.put(h, t), id="put"),
        pytest.param(lambda cache, h, t: cache.put_many({h: t}), id="put_many"),
    ],
)
def test_a_put_across_set_identity_never_stores_a_frame_of_another_dtype_than_its_key(
    open_cache, store
):
    cache = open_cache()
    before = cache.identity
    other = _another_models(cache)
    cache.set_identity(_switching_on_first_key(cache, other))
    with pytest.raises(ValueError, match="bfloat16"):  # the key's dtype, not the new one's
        store(cache, "image", make_tensor(OTHER_SHAPE, torch.float32, 3))
    cache.set_identity(before)
    assert cache.get("image") is None
