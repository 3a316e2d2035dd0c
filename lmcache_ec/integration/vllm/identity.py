"""Who produced an encoder output, as seen from a ``VllmConfig``.

vLLM's ``mm_hash`` covers the media, ``model_config.model`` and the request's
processor kwargs, but not the revision, the dtype, quantization or the
encoder's own config. Those go into the ``EncoderIdentity`` (and so into every
storage name), which keeps two deployments of different weights or encoder
settings from ever exchanging tensors.

Which identifiers are safe to persist: vLLM's content hashes are hex digests
(blake3/sha256: 64 chars, sha512: 128), optionally prefixed ``<lora>:`` with
tower LoRA. Everything else — ``renderer<rank>-mm-<counter>-…`` (processor
cache and prefix caching off: the counter restarts at 0 in every process) and
raw client UUIDs — names a request, not content, and is only persisted when
``persist_non_content_ids`` is set.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import torch

from ...key import SUPPORTED_DTYPES, EncoderIdentity, dtype_name

_CONTENT_ID = re.compile(r"^(?:[^:]{1,256}:)?(?:[0-9a-f]{64}|[0-9a-f]{128})$")
# hf_config keys that describe the encoder tower and projector.
_ENCODER_KEY = re.compile(r"vision|visual|audio|image|video|projector|mm_|qformer|query_tokens")


def is_content_identifier(identifier: str) -> bool:
    """True for vLLM content hashes (optionally LoRA-prefixed)."""
    return bool(_CONTENT_ID.match(identifier))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def encoder_fingerprint(model_config: Any) -> str:
    """sha256 over the encoder sub-configs, mm processor kwargs and quantization."""
    hf = model_config.hf_config
    hf_dict = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    encoder_part = {
        key: value
        for key, value in hf_dict.items()
        if _ENCODER_KEY.search(key) and not key.startswith("_")
    }
    mm_config = getattr(model_config, "multimodal_config", None)
    mm_kwargs = getattr(mm_config, "mm_processor_kwargs", None) if mm_config else None
    document = {
        "encoder": _jsonable(encoder_part),
        "mm_processor_kwargs": _jsonable(mm_kwargs or {}),
        "quantization": str(getattr(model_config, "quantization", None)),
    }
    blob = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def encoder_dtype(model_config: Any) -> str:
    dtype = getattr(model_config, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype in SUPPORTED_DTYPES.values():
        return dtype_name(dtype)
    return ""  # unpinned: entries come back in the dtype they were stored in


def identity_from_vllm(
    vllm_config: Any, *, model: str | None, namespace: str, weights: str = ""
) -> EncoderIdentity:
    """The ``EncoderIdentity`` of this vLLM deployment (``weights``: its weights version)."""
    model_config = vllm_config.model_config
    return EncoderIdentity(
        model=model or str(model_config.model),
        revision=str(getattr(model_config, "revision", None) or ""),
        fingerprint=encoder_fingerprint(model_config),
        dtype=encoder_dtype(model_config),
        namespace=namespace,
        weights=weights,
    )
