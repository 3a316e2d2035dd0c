"""Copies per load on the worker path (stage, then load), counted so they cannot grow.

A CPU-tier hit costs one copy, pool → staged tensor (the pool buffer may be
reused once released); the load then hands that tensor over without another.
A disk hit's payload is read from the file straight into the tensor that is
handed over: no tensor copy at all. Tensor operations are counted with a
``TorchDispatchMode``, which sees only its own thread: the staging loop is
run in the test's thread for that.

A save hands a CPU tensor to the writer thread as it is: no tensor operation
in the forward pass's thread (the frame copy happens in the writer).
"""

from __future__ import annotations

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.metadata import ECTierConnectorMetadata
from lmcache_ec.integration.vllm.worker import TierWorker
from tests.conftest import make_tensor
from tests.copies import CopyCounter


def _tier_worker(cache: ECCache, *, producer: bool) -> TierWorker:
    return TierWorker(
        cache,
        ConnectorSettings(),
        persistable=lambda identifier: True,
        is_producer=producer,
        is_consumer=not producer,
    )


def _worker(cache: ECCache) -> TierWorker:
    worker = _tier_worker(cache, producer=False)
    # Stop the staging thread: the test runs the same loop in its own thread.
    worker._stage_queue.put(None)
    worker._stager.join()
    return worker


def _stage_and_load(worker: TierWorker, identifiers: list[str]) -> tuple[dict, list[str]]:
    encoder_cache: dict[str, torch.Tensor] = {}
    with CopyCounter() as counter:
        worker.stage(identifiers, None, None)
        worker._stage_queue.put(None)
        worker._stage_loop()
        meta = ECTierConnectorMetadata(loads={identifier: 1 for identifier in identifiers})
        worker.start_load_caches(encoder_cache, meta)
    return encoder_cache, counter.copies


@pytest.mark.parametrize("tier", ["cpu", "disk"])
def test_copies_per_load(tier, tmp_path, make_cache):
    config = {"local_cpu": tier == "cpu", "max_local_cpu_size": 0.05}
    if tier == "disk":
        config |= {"local_disk": str(tmp_path), "max_local_disk_size": 0.05}
    identifiers = [f"img-{i}" for i in range(3)]
    tensors = {i: make_tensor((32, 128), torch.bfloat16, seed=n) for n, i in enumerate(identifiers)}
    with make_cache(config, model="org/copies") as cache:
        for identifier, tensor in tensors.items():
            assert cache.put(identifier, tensor)
        assert cache.flush()
        assert {cache.contains(i) for i in identifiers} == {tier}
        worker = _worker(cache)
        try:
            encoder_cache, copies = _stage_and_load(worker, identifiers)
        finally:
            worker.close()
    assert set(encoder_cache) == set(identifiers)
    for identifier, tensor in tensors.items():
        assert torch.equal(encoder_cache[identifier], tensor)
    expected = len(identifiers) if tier == "cpu" else 0
    assert len(copies) == expected, f"{tier} tier: {copies} for {len(identifiers)} loads"


@pytest.mark.parametrize("requires_grad", [False, True])
def test_save_hands_the_tensor_over_without_a_tensor_op(requires_grad, make_cache):
    tensor = make_tensor((32, 128), torch.float32).requires_grad_(requires_grad)
    with make_cache({"max_local_cpu_size": 0.05}, model="org/copies") as cache:
        worker = _tier_worker(cache, producer=True)
        worker.set_weights("weights-1")
        handed: list[torch.Tensor] = []
        put = worker._saver._put
        worker._saver._put = lambda *args: handed.append(args[1]) or put(*args)
        try:
            with CopyCounter() as counter:
                worker.save_caches({"img": tensor}, "img")
            assert worker.flush(10)
            stored = cache.get("img")
        finally:
            worker.close()
    # Only a tensor that carries autograd state is detached, and nothing is copied.
    assert counter.ops == (["aten.detach.default"] if requires_grad else [])
    [saved] = handed
    assert not saved.requires_grad
    assert saved.data_ptr() == tensor.data_ptr()
    assert torch.equal(stored, tensor.detach())
