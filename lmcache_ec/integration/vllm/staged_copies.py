"""The worker's staged copies: encoder outputs read ahead into worker memory.

A load only moves a staged copy into vLLM's encoder cache, so it cannot miss.
Copies staged under weights since replaced are kept apart, for loads only:
the scheduler may have promised one before it heard of the change (one report
behind without a stage channel), and a promised load must not miss (vLLM's
model runner raises). It releases every one of them on hearing the change.

Not thread-safe: the worker's lock guards every call (``worker.py``).
"""

from __future__ import annotations

import torch


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class StagedCopies:
    """Copies staged for loads, within ``limit`` bytes for all of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.current: dict[str, torch.Tensor] = {}  # staged under the weights of now
        self._kept: dict[str, torch.Tensor] = {}  # staged under replaced weights
        self._wanted: set[str] = set()  # ordered and not released
        self.nbytes = 0  # of both

    def order(self, identifiers: list[str]) -> None:
        """``identifiers`` are wanted; a copy kept from older weights is not."""
        self._wanted.update(identifiers)
        for identifier in identifiers:
            self._drop_kept(identifier)

    def is_wanted(self, identifier: str) -> bool:
        return identifier in self._wanted

    def fits(self, tensor: torch.Tensor) -> bool:
        return self.nbytes + _nbytes(tensor) <= self.limit

    def hold(self, identifier: str, tensor: torch.Tensor | None) -> bool:
        """Keep ``tensor`` read for ``identifier``; False if none was read or it
        does not fit (the order then fails)."""
        size = 0 if tensor is None else _nbytes(tensor)
        if tensor is None or self.nbytes + size > self.limit:
            self._wanted.discard(identifier)
            return False
        replaced = self.current.get(identifier)  # ordered again before its release
        if replaced is not None:
            self.nbytes -= _nbytes(replaced)
        self.current[identifier] = tensor
        self.nbytes += size
        return True

    def take(self, identifier: str) -> tuple[torch.Tensor | None, bool]:
        """Take ``identifier``'s copy out: the current one, else one kept from
        replaced weights (then True)."""
        self._wanted.discard(identifier)
        tensor = self.current.pop(identifier, None)
        if tensor is not None:
            self.nbytes -= _nbytes(tensor)
        kept = self._drop_kept(identifier)
        if tensor is not None:
            return tensor, False
        return kept, kept is not None

    def keep_for_loads(self) -> int:
        """The weights changed: every current copy is kept for loads only, nothing
        is wanted any more. How many are kept."""
        self._kept.update(self.current)
        self.current = {}
        self._wanted.clear()
        return len(self._kept)

    def _drop_kept(self, identifier: str) -> torch.Tensor | None:
        kept = self._kept.pop(identifier, None)
        if kept is not None:
            self.nbytes -= _nbytes(kept)
        return kept
