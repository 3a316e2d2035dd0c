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
        # Ordered and not released -> the rows its request expects (0: not said).
        self._wanted: dict[str, int] = {}
        self.nbytes = 0  # of both
        self.wrong_rows: list[tuple[str, int, int]] = []  # refused: (identifier, rows, expected)

    def order(self, identifiers: list[str], rows: dict[str, int] | None = None) -> None:
        """``identifiers`` are wanted (each of its ``rows``); a copy kept from
        older weights is not."""
        for identifier in identifiers:
            self._wanted[identifier] = (rows or {}).get(identifier, 0)
            self._drop_kept(identifier)

    def is_wanted(self, identifier: str) -> bool:
        return identifier in self._wanted

    def fits(self, tensor: torch.Tensor) -> bool:
        return self.nbytes + _nbytes(tensor) <= self.limit

    def hold(self, identifier: str, tensor: torch.Tensor | None) -> bool:
        """Keep ``tensor`` read for ``identifier``; False if none was read, it
        does not fit, or it has other rows than its request's placeholders (the
        order then fails: vLLM could not place it, as with a reused client UUID)."""
        size = 0 if tensor is None else _nbytes(tensor)
        expected = self._wanted.get(identifier, 0)
        if tensor is not None and expected and tensor.shape[0] != expected:
            self.wrong_rows.append((identifier, tensor.shape[0], expected))
            tensor = None
        if tensor is None or self.nbytes + size > self.limit:
            self._wanted.pop(identifier, None)
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
        self._wanted.pop(identifier, None)
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
