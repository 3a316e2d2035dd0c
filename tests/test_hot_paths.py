"""Shortcuts taken on the put and read paths give exactly what the long way gives."""

from __future__ import annotations

import json
import time

import pytest
import torch

from lmcache_ec import codec
from lmcache_ec.key import EncoderIdentity, dtype_name
from tests.conftest import make_tensor

IDENTITIES = [
    EncoderIdentity(model="m"),
    EncoderIdentity(
        model='org/"quoted"\\model',
        revision="r\u00e9v",
        fingerprint="\u6f22\u5b57",
        dtype="bfloat16",
        namespace="ns\n1",
        weights="w\x00",
    ),
]


def _reference_header(key, tensor, created: float) -> bytes:
    header = {
        "name": key.storage_name,
        **key.identity.as_dict(),
        "mm_hash": key.mm_hash,
        "tensor_dtype": dtype_name(tensor.dtype),
        "shape": list(tensor.shape),
        "created": created,
    }
    raw = json.dumps(header, ensure_ascii=True, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % codec.ALIGN)


@pytest.mark.parametrize("identity", IDENTITIES)
@pytest.mark.parametrize("mm_hash", ["h", 'caf\u00e9 \U0001f600 "x"', "a" * 700])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_header_is_the_bytes_json_dumps_gives(identity, mm_hash, dtype, monkeypatch):
    now = 1763885123.4567
    monkeypatch.setattr(time, "time", lambda: now)
    key = identity.key(mm_hash)
    tensor = make_tensor((3, 5), dtype)
    header = codec.encode_header(key, tensor)
    assert header == _reference_header(key, tensor, round(now, 3))
    assert len(header) % codec.ALIGN == 0
    parsed = json.loads(header)
    assert parsed["mm_hash"] == mm_hash and parsed["model"] == identity.model
    assert parsed["shape"] == [3, 5]


def test_header_identity_memo_follows_the_identity():
    tensor = make_tensor((2, 2), torch.bfloat16)
    for weights in ("v1", "v2", "v1"):
        identity = EncoderIdentity(model="m", weights=weights)
        header = json.loads(codec.encode_header(identity.key("h"), tensor))
        assert header["weights"] == weights
