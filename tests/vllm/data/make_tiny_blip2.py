"""Regenerate ``tiny-blip2/``: a BLIP-2 config, tokenizer and processor, no weights.

vLLM's scheduler needs the model's config and multimodal processor (for its
encoder budget), never its weights. BLIP-2 is used because its vLLM module
imports without torchvision. Each image becomes 4 placeholder tokens.

    python tests/vllm/data/make_tiny_blip2.py tests/vllm/data/tiny-blip2
"""

import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    Blip2Config,
    Blip2Processor,
    Blip2QFormerConfig,
    Blip2VisionConfig,
    BlipImageProcessor,
    OPTConfig,
    PreTrainedTokenizerFast,
)

NUM_QUERY_TOKENS = 4
IMAGE_TOKEN_ID = 4


def main(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "</s>": 1, "<s>": 2, "<unk>": 3, "<image>": IMAGE_TOKEN_ID}
    for word in ["a", "b", "c", "d", "describe", "the", "image", "what", "is", "this"]:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )
    images = BlipImageProcessor(size={"height": 28, "width": 28})
    Blip2Processor(
        image_processor=images, tokenizer=fast, num_query_tokens=NUM_QUERY_TOKENS
    ).save_pretrained(target)
    Blip2Config(
        vision_config=Blip2VisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ).to_dict(),
        qformer_config=Blip2QFormerConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            encoder_hidden_size=32,
            vocab_size=32,
        ).to_dict(),
        text_config=OPTConfig(
            vocab_size=32,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=256,
            word_embed_proj_dim=64,
        ).to_dict(),
        num_query_tokens=NUM_QUERY_TOKENS,
        image_token_index=IMAGE_TOKEN_ID,
        torch_dtype="bfloat16",
    ).save_pretrained(target)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
