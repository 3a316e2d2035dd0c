"""Counting tensor copies: a ``TorchDispatchMode`` that records every op, copies apart.

A dispatch mode sees only the thread that entered it.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

COPIES = {"aten.clone.default", "aten.copy_.default", "aten._to_copy.default", "aten.copy.default"}


class CopyCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.copies: list[str] = []
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        if str(func) in COPIES:
            self.copies.append(str(func))
        return func(*args, **(kwargs or {}))
