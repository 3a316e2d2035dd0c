"""The scheduler's item records: one state each, indexed by state, retries outliving states."""

from __future__ import annotations

import logging

from lmcache_ec.integration.vllm.items import ALLOWED, ItemState, ItemTable

S = ItemState


def test_every_state_is_reachable_and_can_be_left():
    targets = {state for allowed in ALLOWED.values() for state in allowed}
    assert targets | {S.UNKNOWN} == set(ItemState)
    assert all(ALLOWED[state] for state in ItemState)


def test_moves_keep_the_state_index(caplog):
    table = ItemTable()
    table.move("a", S.QUEUED, 5.0)
    table.move("b", S.QUEUED, 6.0)
    table.move("a", S.STAGING, 7.0).direct = True
    assert sorted(table.having(S.QUEUED, S.STAGING)) == ["a", "b"]
    assert table.having(S.STAGING) == ["a"] and table.get("a").deadline == 7.0
    table.move("a", S.READY, 8.0)
    assert not table.get("a").direct  # per-state details start afresh
    table.move("a", S.UNKNOWN)
    assert table.get("a") is None and table.state("a") is S.UNKNOWN
    assert table.having(S.READY) == [] and len(table) == 1
    with caplog.at_level(logging.WARNING):
        table.move("b", S.PROMISED)  # never staged: not a transition the scheduler makes
    assert "unexpected transition" in caplog.text
    assert table.state("b") is S.PROMISED  # logged, never raised: scheduling goes on


def test_a_retry_outlives_the_state():
    table = ItemTable()
    item = table.move("a", S.FAILED, 30.0)
    item.retry_after = 30.0
    table.move("a", S.RESIDENT)  # computed meanwhile
    table.move("a", S.UNKNOWN)  # freed by vLLM: still not to be fetched before 30.0
    assert table.state("a") is S.FAILED and table.get("a").deadline == 30.0
    table.forget_retries()  # new weights: old failures say nothing
    assert table.get("a") is None
