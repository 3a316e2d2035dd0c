"""Entries written through a ``DirectoryBudget`` as a tier writes them, for the budget tests."""

from __future__ import annotations

from lmcache_ec.key import EncoderIdentity
from lmcache_ec.tiers.budget import DirectoryBudget


def entry_names(count: int) -> list[str]:
    """``count`` storage names of distinct entries."""
    identity = EncoderIdentity(model="m", dtype="float16")
    return [identity.key(f"e{i}").storage_name for i in range(count)]


def publish(budget: DirectoryBudget, name: str, size: int) -> None:
    """Entry ``name`` of ``size`` bytes written within ``budget``, as a tier does."""
    temp = budget.reserve(name, size)
    assert temp is not None, f"no room for {name}"
    assert budget.layout.write(name, bytes(size), temp=temp)
    budget.wrote(name)
