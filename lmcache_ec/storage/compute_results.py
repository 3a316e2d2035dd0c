"""What ``get_or_compute``'s ``compute`` returned, checked before anything is stored.

Checked against the identity of the call (``GetOrCompute.run``), not the cache's
current one: ``set_identity`` may run while ``compute`` does, and the results are
keyed, stored and returned as the call's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import codec
from ..codec import validate_tensor
from ..key import EncoderIdentity


def checked_results(
    hashes: list[str],
    tensors: Any,
    identity: EncoderIdentity,
    check_fits: Callable[[int], None],
) -> list[torch.Tensor]:
    """``tensors``, one storable tensor of ``identity``'s dtype per hash, whose
    frame passes ``check_fits``; ``TypeError``/``ValueError`` otherwise."""
    if not isinstance(tensors, Sequence) or isinstance(tensors, (str, bytes)):
        raise TypeError(f"compute must return a sequence of tensors, got {type(tensors).__name__}")
    if len(tensors) != len(hashes):
        raise ValueError(f"compute returned {len(tensors)} tensors for {len(hashes)} entries")
    for mm_hash, tensor in zip(hashes, tensors, strict=True):
        try:
            validate_tensor(tensor, identity.dtype)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"compute's result for {mm_hash!r:.60}: {exc}") from None
        header = codec.encode_header(identity.key(mm_hash), tensor)
        check_fits(codec.frame_size(header, tensor))
    return list(tensors)
