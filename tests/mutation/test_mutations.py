"""The mutation list still applies to the code (fast; the mutation run itself is not here).

Each mutation's text must occur exactly once in its file, and each test it
names must exist, so that a refactoring that moves the code or renames a
test shows here, in the default suite, and not only when someone next runs
``python -m tests.mutation``.
"""

from __future__ import annotations

import re

import pytest

from tests.mutation.mutations import CANARY, MUTATIONS, Mutation
from tests.mutation.run import ROOT

ALL = [CANARY, *MUTATIONS]


def test_names_are_unique():
    names = [m.name for m in ALL]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("mutation", ALL, ids=lambda m: m.name)
def test_snippet_occurs_once_and_the_mutation_changes_it(mutation: Mutation):
    text = (ROOT / mutation.path).read_text()
    assert text.count(mutation.find) == 1, f"update {mutation.name}: snippet not found once"
    assert mutation.replace != mutation.find


@pytest.mark.parametrize("mutation", ALL, ids=lambda m: m.name)
def test_named_tests_exist(mutation: Mutation):
    assert mutation.tests
    for test in mutation.tests:
        path, _, name = test.partition("::")
        function = re.sub(r"\[.*\]$", "", name)
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {re.escape(function)}\(", source, flags=re.M), test
