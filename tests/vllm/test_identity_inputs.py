"""Whatever changes an encoder's output changes its key, and nothing else names content.

The fingerprint of an ``EncoderIdentity`` covers the whole HF config but its
text part (encoder settings of any name, ``--hf-overrides`` included), the
processor config files of the model directory or hub snapshot, and the
multimodal settings that change what the encoder returns (video pruning, FP8
attention…). A tower-LoRA identifier carries only the adapter's name, so it
is not persisted. An extra miss is acceptable; a wrong tensor is not.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import huggingface_hub.constants
import pytest
import torch
from vllm.config import ModelConfig
from vllm.lora.request import LoRARequest
from vllm.v1.engine.input_processor import InputProcessor

from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.identity import encoder_fingerprint, is_content_identifier

from . import cpu_env
from .harness import Engine, image_hash, make_vllm_config


def _model_config(model_dir: str = cpu_env.MODEL_DIR, **kwargs) -> ModelConfig:
    return ModelConfig(
        model=model_dir, tokenizer=model_dir, max_model_len=256, dtype="bfloat16", **kwargs
    )


# --- multimodal settings ---------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("video_pruning_rate", 0.5),
        ("video_pruning_method", "vidcom2"),
        ("mm_encoder_attn_dtype", "fp8"),
        ("media_io_kwargs", {"video": {"num_frames": 8}}),
    ],
)
def test_a_multimodal_setting_that_changes_encoder_outputs_changes_the_fingerprint(
    model_config, field, value
):
    changed = copy.deepcopy(model_config)
    setattr(changed.multimodal_config, field, value)
    assert encoder_fingerprint(changed) != encoder_fingerprint(model_config)


def test_video_pruning_given_as_vllm_takes_it_changes_the_fingerprint():
    """``--video-pruning-rate`` through ModelConfig, as vLLM's CLI passes it."""
    assert encoder_fingerprint(_model_config(video_pruning_rate=0.5)) != encoder_fingerprint(
        _model_config()
    )


def test_new_fp8_attention_scales_under_the_same_path_change_the_fingerprint(
    model_config, tmp_path
):
    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps({"layer0": 1.0}))
    config = copy.deepcopy(model_config)
    config.multimodal_config.mm_encoder_attn_dtype = "fp8"
    config.multimodal_config.mm_encoder_fp8_scale_path = str(scales)
    before = encoder_fingerprint(config)
    scales.write_text(json.dumps({"layer0": 2.0}))
    assert encoder_fingerprint(config) != before


# --- the HF config ---------------------------------------------------------


@pytest.mark.parametrize(
    "override",
    [
        {"max_dynamic_patch": 1},
        {"use_thumbnail": False},
        {"ps_version": "v1"},
        {"select_layer": -4},
    ],
)
def test_an_hf_override_of_an_encoder_setting_of_any_name_changes_the_fingerprint(override):
    """InternVL's tiling and pixel-shuffle settings sit at the top of its HF config."""
    base = {"max_dynamic_patch": 12, "use_thumbnail": True, "ps_version": "v2", "select_layer": -1}
    before = encoder_fingerprint(_model_config(hf_overrides=base))
    assert encoder_fingerprint(_model_config(hf_overrides={**base, **override})) != before


def test_text_config_edits_and_the_loaders_dtype_rewrite_keep_the_fingerprint(model_config):
    base = encoder_fingerprint(model_config)
    changed = copy.deepcopy(model_config)
    changed.hf_config.text_config.num_hidden_layers = 2  # the language model only
    assert encoder_fingerprint(changed) == base
    changed = copy.deepcopy(model_config)
    # vLLM's Transformers backend sets config.dtype while the worker loads the
    # model: the scheduler and the worker of one process must still agree.
    changed.hf_config.dtype = torch.float32
    assert encoder_fingerprint(changed) == base


def test_a_config_value_without_a_stable_repr_gives_every_process_the_same_fingerprint(
    model_config,
):
    first, second = copy.deepcopy(model_config), copy.deepcopy(model_config)
    first.hf_config.vision_helper = object()  # repr names its address
    second.hf_config.vision_helper = object()
    assert encoder_fingerprint(first) == encoder_fingerprint(second)


# --- processor config files ------------------------------------------------


@pytest.fixture
def model_copy(tmp_path) -> str:
    path = tmp_path / "tiny-blip2"
    shutil.copytree(cpu_env.MODEL_DIR, path)
    return str(path)


def test_an_edited_processor_config_changes_the_fingerprint(model_copy):
    before = encoder_fingerprint(_model_config(model_copy))
    path = os.path.join(model_copy, "processor_config.json")
    with open(path) as file:
        config = json.load(file)
    config["image_processor"]["image_mean"] = [0.5, 0.5, 0.5]
    with open(path, "w") as file:
        json.dump(config, file)
    assert encoder_fingerprint(_model_config(model_copy)) != before


@pytest.mark.parametrize("name", ["preprocessor_config.json", "video_preprocessor_config.json"])
def test_an_added_processor_file_changes_the_fingerprint(model_copy, name):
    before = encoder_fingerprint(_model_config(model_copy))
    with open(os.path.join(model_copy, name), "w") as file:
        json.dump({"max_pixels": 1024}, file)
    assert encoder_fingerprint(_model_config(model_copy)) != before


def _snapshot(cache, repo: str, commit: str, processor: dict) -> None:
    """A hub snapshot of ``repo`` at ``commit`` in the HF cache, as the hub client lays it."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "processor_config.json").write_text(json.dumps(processor))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)


def test_a_hub_models_processor_config_is_read_from_its_snapshot(
    model_config, tmp_path, monkeypatch
):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no hub to ask
    hub = copy.deepcopy(model_config)
    hub.model, hub.revision = "org/tiny-vlm", None
    _snapshot(tmp_path, hub.model, "a" * 40, {"image_processor": {"image_mean": [0.4]}})
    before = encoder_fingerprint(hub)
    shutil.rmtree(tmp_path / "models--org--tiny-vlm")
    # "main" moved to a commit with another normalisation: another key.
    _snapshot(tmp_path, hub.model, "b" * 40, {"image_processor": {"image_mean": [0.5]}})
    assert encoder_fingerprint(hub) != before


def test_a_hub_models_remote_code_is_named_by_its_snapshot(model_config, tmp_path, monkeypatch):
    """``trust_remote_code`` with the revision unpinned: "main" moving to a commit
    with other code gives another key, though every config file is the same."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub = copy.deepcopy(model_config)
    hub.model, hub.revision, hub.trust_remote_code = "org/tiny-vlm", None, True
    for commit in ("a" * 40, "b" * 40):
        _snapshot(tmp_path, hub.model, commit, {"image_processor": {"image_mean": [0.4]}})
        (tmp_path / "models--org--tiny-vlm" / "snapshots" / commit / "config.json").write_text("{}")
    (tmp_path / "models--org--tiny-vlm" / "refs" / "main").write_text("a" * 40)
    before = encoder_fingerprint(hub)
    (tmp_path / "models--org--tiny-vlm" / "refs" / "main").write_text("b" * 40)
    assert encoder_fingerprint(hub) != before


# --- tower LoRA ------------------------------------------------------------


def _tower_lora_identifier(mm_hash: str, request: LoRARequest) -> str:
    """The identifier vLLM's input processor gives an item under a tower LoRA."""
    processor = type("Processor", (), {})()
    processor.lora_config = type("LoRAConfig", (), {"enable_tower_connector_lora": True})()
    return InputProcessor._get_mm_identifier(processor, mm_hash, request)


def test_two_adapters_under_one_name_share_vllms_identifier_and_it_is_not_persisted():
    mm_hash = image_hash("cat.png")
    v1 = _tower_lora_identifier(mm_hash, LoRARequest("vision-ft", 1, "/adapters/vision-ft-v1"))
    v2 = _tower_lora_identifier(mm_hash, LoRARequest("vision-ft", 7, "/adapters/vision-ft-v2"))
    assert v1 == v2  # only the adapter's name: nothing tells the two apart
    assert not is_content_identifier(v1)
    assert not ConnectorSettings.from_extra_config({}).persistable(v1)


def test_an_item_under_a_tower_lora_is_computed_and_never_saved(model_config, disk_dir):
    tiers = {"max_local_cpu_size": 0.01, "local_disk": str(disk_dir), "max_local_disk_size": 0.1}
    identifier = "vision-ft:" + image_hash("cat.png")
    for _ in range(2):
        engine = Engine(make_vllm_config(model_config, "ec_both", {"lmcache_config": tiers}))
        try:
            engine.run_until_finished([engine.add_request([identifier])])
            engine.flush()
            assert engine.encoded == [identifier]  # computed each time, never loaded
        finally:
            engine.shutdown()
    assert [n for n in os.listdir(disk_dir) if n.endswith(".pt")] == []


# --- the code around the model -----------------------------------------------


def test_remote_code_of_a_model_directory_is_part_of_the_fingerprint(tmp_path):
    """An edited ``image_processing_*.py`` of a ``trust_remote_code`` model decides
    other pixels under the same config files."""
    model_dir = tmp_path / "model"
    shutil.copytree(cpu_env.MODEL_DIR, model_dir)
    code = model_dir / "image_processing_tiny.py"
    code.write_text("SCALE = 1.0\n")
    trusted = _model_config(str(model_dir), trust_remote_code=True)
    plain = _model_config(str(model_dir))
    before, before_plain = encoder_fingerprint(trusted), encoder_fingerprint(plain)
    code.write_text("SCALE = 0.5\n")
    assert encoder_fingerprint(trusted) != before
    assert encoder_fingerprint(plain) == before_plain  # no remote code runs without trust


@pytest.mark.parametrize("package", ["vllm", "transformers"])
def test_another_release_of_vllm_or_transformers_changes_the_fingerprint(
    model_config, monkeypatch, package
):
    import importlib.metadata

    before = encoder_fingerprint(model_config)
    installed = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "99.0" if name == package else installed(name)
    )
    assert encoder_fingerprint(model_config) != before


def test_transformers_falling_back_to_its_pil_processors_changes_the_fingerprint(
    model_config, monkeypatch
):
    import transformers.utils

    before = encoder_fingerprint(model_config)
    available = transformers.utils.is_torchvision_available()
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: not available)
    assert encoder_fingerprint(model_config) != before
