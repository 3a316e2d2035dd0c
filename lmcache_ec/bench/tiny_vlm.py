"""A tiny random-weight BLIP-2 that ``vllm serve`` loads like any HF checkpoint.

Real serving tests and ``bench serve`` need a multimodal model whose encoder
does real work, without downloading weights. ``build_tiny_blip2`` writes a
complete model directory — ``config.json``, tokenizer, processor and
``model.safetensors`` — generated from seeds, in a few seconds:

- BLIP-2 because vLLM's ``blip2`` module imports without torchvision.
- The vision tower (ViT, 768 wide, 6 layers, 336 px: 577 patches) is most of
  the compute of a cache miss, so encoder loads are visible in TTFT; the
  language model (OPT, 256 wide, 2 layers) is cheap.
- Weights are drawn directly (not transformers' ``_init_weights``, whose
  vision init is ~1e-10 on some layers and makes every image look alike):
  matrices ``N(0, 1/fan_in)``, biases small, norms at 1, so an image's pixels
  reach the logits. Distinct images give distinct logprobs.
- ``seed`` draws everything; ``vision_seed`` (default: ``seed``) redraws only
  ``vision_model.*``, so two directories can differ in their encoder alone
  (for weight-update tests: the same image must then give other outputs).

Directories are cached under ``root`` by a hash of every parameter; a second
call with the same parameters returns the existing directory. Builds are
atomic (temporary directory, then rename), so concurrent callers are safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FORMAT = 4  # bump when the layout or the weight recipe changes
IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 4
_SPECIAL = ("<pad>", "</s>", "<s>", "<unk>", IMAGE_TOKEN)
_WORDS = tuple(
    " ".join(
        (
            "a an the this that is are was what which who describe image picture photo of",
            "in on with and or to it its color red green blue black white big small left",
            "right top bottom one two three many some there here show tell me please",
            "answer question yes no cat dog car tree sky sea house person",
        )
    ).split()
)
# A plain-text chat template: user/assistant turns, one per line.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }} {% endif %}"
    "{% endfor %}{% endif %}\n"
    "{% endfor %}"
)


@dataclass(frozen=True)
class TinyVLMSpec:
    """Every parameter that shapes the generated directory."""

    seed: int = 0
    vision_seed: int | None = None  # None: same as seed
    image_size: int = 336
    patch_size: int = 14
    vision_hidden: int = 768
    vision_layers: int = 6
    vision_heads: int = 12
    qformer_hidden: int = 256
    qformer_layers: int = 2
    num_query_tokens: int = 32
    text_hidden: int = 256
    text_layers: int = 2
    vocab_size: int = 512
    max_positions: int = 8192  # room for long background decodes

    @property
    def effective_vision_seed(self) -> int:
        return self.seed if self.vision_seed is None else self.vision_seed

    def digest(self) -> str:
        payload = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_tiny_blip2(root: str | os.PathLike, spec: TinyVLMSpec | None = None, **params) -> Path:
    """The model directory for ``spec`` (or ``TinyVLMSpec(**params)``) under ``root``.

    Built on first use, reused afterwards. Returns the directory path, which
    ``vllm serve`` accepts as its model argument (served name = the path).
    """
    spec = spec or TinyVLMSpec(**params)
    root = Path(root)
    target = root / f"tiny-blip2-{spec.digest()}"
    if (target / "model.safetensors").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        _write(staging, spec)
        try:
            staging.rename(target)
        except OSError:  # another builder won the race
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write(target: Path, spec: TinyVLMSpec) -> None:
    config = _config(spec)
    config.architectures = ["Blip2ForConditionalGeneration"]  # else vLLM serves pooling
    config.save_pretrained(target)
    _processor(spec).save_pretrained(target)
    _weights(config, spec, target / "model.safetensors")
    (target / "tiny_vlm.json").write_text(
        json.dumps({"format": FORMAT, **asdict(spec)}, indent=2, sort_keys=True) + "\n"
    )


def _config(spec: TinyVLMSpec):
    from transformers import Blip2Config, Blip2QFormerConfig, Blip2VisionConfig, OPTConfig

    return Blip2Config(
        vision_config=Blip2VisionConfig(
            hidden_size=spec.vision_hidden,
            intermediate_size=4 * spec.vision_hidden,
            num_hidden_layers=spec.vision_layers,
            num_attention_heads=spec.vision_heads,
            image_size=spec.image_size,
            patch_size=spec.patch_size,
        ).to_dict(),
        qformer_config=Blip2QFormerConfig(
            hidden_size=spec.qformer_hidden,
            intermediate_size=4 * spec.qformer_hidden,
            num_hidden_layers=spec.qformer_layers,
            num_attention_heads=4,
            encoder_hidden_size=spec.vision_hidden,
            vocab_size=spec.vocab_size,
            cross_attention_frequency=1,
        ).to_dict(),
        text_config=OPTConfig(
            vocab_size=spec.vocab_size,
            hidden_size=spec.text_hidden,
            ffn_dim=4 * spec.text_hidden,
            num_hidden_layers=spec.text_layers,
            num_attention_heads=4,
            max_position_embeddings=spec.max_positions,
            word_embed_proj_dim=spec.text_hidden,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
        ).to_dict(),
        num_query_tokens=spec.num_query_tokens,
        image_token_index=IMAGE_TOKEN_ID,
        torch_dtype="float32",
    )


def _processor(spec: TinyVLMSpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Blip2Processor, BlipImageProcessor, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(_SPECIAL)}
    for word in _WORDS:
        vocab.setdefault(word, len(vocab))
    index = 0
    while len(vocab) < spec.vocab_size:
        vocab.setdefault(f"w{index}", len(vocab))
        index += 1
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_positions,
    )
    # Blip2Processor adds "<image>" (already id 4) as a special AddedToken, as
    # its __call__ expects; an ``image_token`` string attribute would break it.
    images = BlipImageProcessor(size={"height": spec.image_size, "width": spec.image_size})
    return Blip2Processor(
        image_processor=images, tokenizer=fast, num_query_tokens=spec.num_query_tokens
    )


def _weights(config, spec: TinyVLMSpec, path: Path) -> None:
    """Draw every tensor of ``Blip2ForConditionalGeneration`` from the seeds."""
    import torch
    from safetensors.torch import save_file
    from transformers import Blip2ForConditionalGeneration

    with torch.device("meta"):
        shapes = {
            name: tuple(t.shape)
            for name, t in Blip2ForConditionalGeneration(config).state_dict().items()
        }
    main = torch.Generator().manual_seed(spec.seed)
    vision = torch.Generator().manual_seed(spec.effective_vision_seed)
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        if name == "language_model.lm_head.weight":  # tied to the input embeddings
            continue
        generator = vision if name.startswith("vision_model.") else main
        tensors[name] = _draw(name, shapes[name], generator)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _draw(name: str, shape: tuple[int, ...], generator) -> Any:
    import torch

    leaf = name.rsplit(".", 1)[-1]
    noise = torch.randn(shape, generator=generator)
    if "norm" in name.lower() and leaf == "weight":
        return torch.ones(shape)
    if leaf == "bias" or len(shape) == 1:
        return 0.02 * noise
    if "position" in name or "class_embedding" in name:
        return 0.1 * noise
    if "query_tokens" in name:
        return noise
    if "embed_tokens" in name:  # also the output projection (tied)
        return 0.15 * noise
    fan_in = 1
    for size in shape[1:]:
        fan_in *= size
    return noise / fan_in**0.5


__all__ = ["CHAT_TEMPLATE", "TinyVLMSpec", "build_tiny_blip2"]
