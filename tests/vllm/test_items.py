"""The scheduler's item records: one state each, moved only as ``ALLOWED`` lists, indexed
by state, with retries outliving states and every change reported once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmcache_ec.integration.vllm.items import ALLOWED, IllegalTransition, ItemState, ItemTable

S = ItemState
DOC = Path(__file__).parents[2] / "docs" / "vllm.md"


def test_every_state_is_reachable_and_can_be_left():
    targets = {state for allowed in ALLOWED.values() for state in allowed}
    assert targets | {S.UNKNOWN} == set(ItemState)
    assert all(ALLOWED[state] for state in ItemState)


def test_moves_keep_the_state_index():
    table = ItemTable()
    table.move("a", S.QUEUED, 5.0)
    table.move("b", S.QUEUED, 6.0)
    table.stage("a", 7.0, direct=True)
    assert sorted(table.having(S.QUEUED, S.STAGING)) == ["a", "b"]
    assert table.having(S.STAGING) == ["a"] and table.get("a").deadline == 7.0
    assert table.add_ranks("a", 1) == 1 and table.get("a").direct
    table.move("a", S.READY, 8.0)
    assert not table.get("a").direct and table.get("a").ranks == 0  # details start afresh
    table.move("a", S.UNKNOWN)
    assert table.get("a") is None and table.state("a") is S.UNKNOWN
    assert table.having(S.READY) == [] and len(table) == 1


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ([], S.PROMISED),  # never staged
        ([], S.LOADED),  # never promised
        ([S.QUEUED], S.READY),  # never ordered
        ([S.RESIDENT], S.FAILED),  # computed: nothing to give up
        ([S.QUEUED, S.STAGING, S.READY, S.PROMISED, S.LOADED], S.READY),  # loaded once
    ],
    ids=["never-staged", "never-promised", "never-ordered", "computed", "loaded"],
)
def test_an_illegal_transition_raises_and_changes_nothing(path, illegal):
    table = ItemTable()
    for state in path:
        table.move("a", state, 1.0)
    before = table.get("a")
    with pytest.raises(IllegalTransition, match=f"-> {illegal.value}"):
        table.move("a", illegal, 2.0)
    assert table.get("a") is before
    assert table.having(illegal) == []


def test_a_retry_outlives_the_state():
    table = ItemTable()
    table.fail("a", 30.0)
    assert table.state("a") is S.FAILED and table.get("a").deadline == 30.0
    table.move("a", S.RESIDENT)  # computed meanwhile
    table.move("a", S.UNKNOWN)  # freed by vLLM: no record, and still no fetch before 30.0
    assert table.get("a") is None and table.retry_at("a") == 30.0
    table.take_due(29.0)
    assert table.retry_at("a") == 30.0
    table.take_due(30.0)  # passed: forgotten
    assert table.retry_at("a") == 0.0
    table.fail("b", 40.0)
    table.forget_retries()  # new weights: old failures say nothing
    assert table.get("b") is None and table.retry_at("b") == 0.0


def test_changes_and_deadlines_are_reported_once():
    table = ItemTable()
    table.move("a", S.QUEUED, 5.0)
    table.move("b", S.QUEUED, 9.0)
    assert table.take_changed() == {"a", "b"} and table.take_changed() == set()
    table.stage("a", 6.0, direct=True)
    assert table.take_changed() == {"a"}
    assert table.take_due(5.5) == []  # a's first deadline no longer holds
    assert table.take_due(6.0) == ["a"]
    assert table.take_due(8.0) == []  # each deadline once
    table.move("b", S.UNKNOWN)
    assert table.take_due(10.0) == []  # no record: nothing due


def _diagram_edges() -> set[tuple[str, str]]:
    block = re.search(r"```mermaid\nstateDiagram-v2\n(.*?)```", DOC.read_text(), re.S)
    assert block, "docs/vllm.md has no Mermaid state diagram"
    edges = set()
    for line in block.group(1).splitlines():
        edge = re.match(r"\s*(\w+)\s*-->\s*(\w+)\s*(:.*)?$", line)
        if edge:
            edges.add((edge.group(1), edge.group(2)))
    return edges


def test_the_state_diagram_in_the_docs_is_the_allowed_table():
    allowed = {(old.name, new.name) for old, targets in ALLOWED.items() for new in targets}
    drawn = _diagram_edges()
    assert drawn - allowed == set(), "drawn in docs/vllm.md, not allowed in items.py"
    assert allowed - drawn == set(), "allowed in items.py, not drawn in docs/vllm.md"
