"""A save whose host copy fails (host or pinned memory exhausted, a device
error) is a skipped save: nothing is raised into vLLM's forward pass, its
slot in the write queue is given back, the save is counted dropped
(``saves_dropped``) and the failure logged once, and later saves go through.
A put that raises at every save (an output larger than the tier) is counted
each time and logged once."""

from __future__ import annotations

import logging

import torch

from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.saver import SaveQueue
from lmcache_ec.integration.vllm.worker import TierWorker
from tests.conftest import make_tensor

MAX_PENDING = 2


def _host_copy_fails(monkeypatch) -> torch.Tensor:
    """An accelerator tensor (neither CPU nor CUDA: copied with ``to``) whose
    host copy raises as an exhausted host would."""
    to = torch.Tensor.to

    def failing_to(self, *args, **kwargs):
        if self.is_meta:
            raise RuntimeError("out of memory: cannot allocate the host copy")
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", failing_to)
    return torch.empty((32, 128), device="meta")


def test_a_failed_host_copy_never_reaches_the_forward_pass(monkeypatch, caplog, make_cache):
    device_tensor = _host_copy_fails(monkeypatch)
    good = make_tensor((32, 128), torch.float32)
    caplog.set_level(logging.WARNING, logger="lmcache_ec.integration.vllm.saver")
    with make_cache({"max_local_cpu_size": 0.05}, model="org/saves") as cache:
        worker = TierWorker(
            cache,
            ConnectorSettings(max_pending_saves=MAX_PENDING),
            persistable=lambda identifier: True,
            is_producer=True,
            is_consumer=False,
        )
        worker.set_weights("weights-1")
        try:
            # More failures than there are slots: none may keep one.
            for i in range(MAX_PENDING + 1):
                worker.save_caches({f"img-{i}": device_tensor}, f"img-{i}")
            assert worker._saver.pending() == 0
            assert worker._saver.flush(0)  # nothing to wait for
            # The same item, once its copy can be made, is saved after all.
            worker.save_caches({"img-0": good}, "img-0")
            assert worker.flush(10)
            stats = worker.build_worker_meta().stats
            stored = cache.get("img-0")
        finally:
            worker.close()
    assert stats["saves_dropped"] == MAX_PENDING + 1
    assert stats["saves_submitted"] == 1
    assert "save_failures" not in stats
    assert stored is not None and torch.equal(stored, good)
    warned = [r for r in caplog.records if "host copy failed" in r.getMessage()]
    assert len(warned) == 1  # once, not once per save


def test_the_queue_gives_a_failed_hand_off_its_slot_back(monkeypatch):
    device_tensor = _host_copy_fails(monkeypatch)
    done: list[tuple[str, bool]] = []
    saves = SaveQueue(
        lambda identifier, tensor, tag: True,
        lambda identifier, stored, seconds, tag: done.append((identifier, stored)),
        MAX_PENDING,
    )
    try:
        assert [saves.submit(f"img-{i}", device_tensor) for i in range(3)] == [False] * 3
        assert saves.pending() == 0
        assert saves.submit("img-cpu", torch.ones(2, 2))
        assert saves.flush(10)
    finally:
        saves.close(10)
    assert done == [("img-cpu", True)]  # refused hand-offs: never reported saved


def test_a_put_that_raises_at_every_save_is_logged_once_and_counted_each_time(caplog):
    """Outputs larger than the tier fail at every save: one line, a count per save."""
    done: list[bool] = []

    def put(identifier, tensor, tag):
        raise ValueError("the output is larger than the CPU tier")

    saves = SaveQueue(put, lambda identifier, stored, seconds, tag: done.append(stored), 4)
    caplog.set_level(logging.WARNING, logger="lmcache_ec.integration.vllm.saver")
    try:
        for i in range(5):
            assert saves.submit(f"img-{i}", torch.ones(2, 2))
            assert saves.flush(10)
    finally:
        saves.close(10)
    assert done == [False] * 5  # each counted as a failed save (save_failures)
    warned = [r for r in caplog.records if "put failed" in r.getMessage()]
    assert len(warned) == 1
