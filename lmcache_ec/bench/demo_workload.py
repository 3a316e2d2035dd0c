"""The demo workload: a real (randomly initialised) SigLIP vision tower on CPU.

``run_demo`` draws ``images`` synthetic pictures, replays ``requests`` image
requests drawn from a Zipf distribution (a few images are popular, most are
rare, as in real traffic) and, for each request, does what a serving engine
does with an encoder cache: ``get`` the encoder output by ``mm_hash``; on a
miss run the vision tower and ``put`` its output. Part-way through, the cache
is closed and reopened on the same configuration — a restart — so entries the
CPU tier lost come back from disk. Finally a sample of cached outputs is
compared bit for bit with a fresh encode.

The time a cache-less engine would need is estimated as
``requests x mean encode time`` measured in the same run.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..engine import ECCache

DEMO_MODEL = "lmcache-ec/demo-siglip"
DEMO_NAMESPACE = "lmcache-ec-demo"
IMAGE_SIZE = 224
TOWER = {
    "image_size": IMAGE_SIZE,
    "patch_size": 14,  # 16 x 16 = 256 output tokens, like Gemma-3's 256
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
}
OUTPUT_DTYPE = torch.bfloat16


class Reporter(Protocol):
    def phase(self, name: str, total: int) -> None: ...
    def advance(self) -> None: ...


class _Silent:
    def phase(self, name: str, total: int) -> None:
        pass

    def advance(self) -> None:
        pass


@dataclass
class PhaseResult:
    name: str
    requests: int = 0
    hits: Counter[str] = field(default_factory=Counter)
    misses: int = 0
    encode_seconds: float = 0.0
    cache_seconds: float = 0.0  # get + put

    @property
    def hit_count(self) -> int:
        return sum(self.hits.values())


@dataclass
class DemoReport:
    images: int
    requests: int
    seed: int
    config_source: str
    tiers: list[str]
    phases: list[PhaseResult]
    encode_count: int
    encode_seconds: float
    cache_seconds: float
    setup_seconds: float
    verified: int
    mismatched: int
    tokens: int
    hidden: int
    removed_before: int

    @property
    def mean_encode_seconds(self) -> float:
        return self.encode_seconds / max(self.encode_count, 1)

    @property
    def baseline_seconds(self) -> float:
        """Estimated time to encode every request with no cache."""
        return self.requests * self.mean_encode_seconds

    @property
    def actual_seconds(self) -> float:
        return self.encode_seconds + self.cache_seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "requests": self.requests,
            "seed": self.seed,
            "tiers": self.tiers,
            "phases": [
                {
                    "name": p.name,
                    "requests": p.requests,
                    "hits": dict(p.hits),
                    "misses": p.misses,
                    "encode_seconds": p.encode_seconds,
                    "cache_seconds": p.cache_seconds,
                }
                for p in self.phases
            ],
            "encode_count": self.encode_count,
            "mean_encode_seconds": self.mean_encode_seconds,
            "baseline_seconds": self.baseline_seconds,
            "actual_seconds": self.actual_seconds,
            "verified": self.verified,
            "mismatched": self.mismatched,
        }


def draw_image(index: int, seed: int) -> torch.Tensor:
    """A deterministic ``[H, W, 3]`` uint8 picture: gradient, boxes and discs."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    size = IMAGE_SIZE
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    base = torch.rand(3, generator=gen) * 255
    tilt = torch.rand(3, generator=gen) - 0.5
    image = (base[:, None, None] + tilt[:, None, None] * (xs + ys)).clamp(0, 255)
    for _ in range(6):
        color = torch.rand(3, generator=gen) * 255
        cx, cy, r = (
            torch.randint(0, size, (3,), generator=gen) // torch.tensor([1, 1, 4])
        ).tolist()
        if torch.rand(1, generator=gen).item() < 0.5:
            mask = (xs - cx) ** 2 + (ys - cy) ** 2 < (r + 4) ** 2
        else:
            mask = ((xs - cx).abs() < r + 4) & ((ys - cy).abs() < r // 2 + 4)
        image[:, mask] = color[:, None]
    return image.permute(1, 2, 0).to(torch.uint8).contiguous()


def image_hash(image: torch.Tensor, model: str = DEMO_MODEL) -> str:
    """The request identifier, as vLLM derives it: a hash of the item and the model."""
    digest = hashlib.blake2b(digest_size=32)
    digest.update(json.dumps(list(image.shape)).encode())
    digest.update(image.numpy().tobytes())
    digest.update(model.encode())
    return digest.hexdigest()


def zipf_choices(images: int, requests: int, seed: int, exponent: float = 1.1) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, images + 1, dtype=torch.float64) ** exponent
    order = torch.randperm(images, generator=gen)  # popularity is not image index
    picks = torch.multinomial(weights, requests, replacement=True, generator=gen)
    return order[picks].tolist()


class VisionTower:
    """A randomly initialised SigLIP vision model (no weight download)."""

    def __init__(self, seed: int) -> None:
        from transformers import SiglipVisionConfig, SiglipVisionModel

        torch.manual_seed(seed)
        self.config = SiglipVisionConfig(**TOWER)
        self.model = SiglipVisionModel(self.config).eval()
        # The weights come from the seed: it belongs to the encoder identity.
        self.fingerprint = hashlib.sha256(
            json.dumps({**TOWER, "seed": seed, "dtype": str(OUTPUT_DTYPE)}).encode()
        ).hexdigest()[:16]

    @torch.inference_mode()
    def encode(self, image: torch.Tensor) -> torch.Tensor:
        pixels = image.permute(2, 0, 1).unsqueeze(0).float() / 255.0
        pixels = (pixels - 0.5) / 0.5  # SigLIP's normalisation
        out = self.model(pixel_values=pixels).last_hidden_state[0]
        return out.to(OUTPUT_DTYPE).contiguous()


def _open(source: Any, tower: VisionTower) -> ECCache:
    return ECCache.from_config(
        source,
        model=DEMO_MODEL,
        namespace=DEMO_NAMESPACE,
        fingerprint=tower.fingerprint,
        dtype=OUTPUT_DTYPE,
    )


def _serve(
    cache: ECCache,
    tower: VisionTower,
    images: list[torch.Tensor],
    hashes: list[str],
    picks: list[int],
    result: PhaseResult,
    reporter: Reporter,
) -> int:
    encodes = 0
    reporter.phase(result.name, len(picks))
    for index in picks:
        started = time.perf_counter()
        cached = cache.get(hashes[index])
        result.cache_seconds += time.perf_counter() - started
        if cached is None:
            started = time.perf_counter()
            output = tower.encode(images[index])
            result.encode_seconds += time.perf_counter() - started
            encodes += 1
            started = time.perf_counter()
            cache.put(hashes[index], output)
            result.cache_seconds += time.perf_counter() - started
            result.misses += 1
        result.requests += 1
        reporter.advance()
    snapshot = cache.stats.snapshot()
    result.hits.update(snapshot["hits"])
    return encodes


def run_demo(
    source: Any = None,
    *,
    images: int = 48,
    requests: int = 300,
    seed: int = 0,
    restart_fraction: float = 0.6,
    verify: int = 4,
    reuse: bool = False,
    reporter: Reporter | None = None,
) -> DemoReport:
    """Run the workload against the tier configured by ``source`` (see ``load_config``)."""
    if images < 1 or requests < 1:
        raise ValueError("images and requests must be >= 1")
    reporter = reporter or _Silent()
    started = time.perf_counter()
    tower = VisionTower(seed)
    pictures = [draw_image(i, seed) for i in range(images)]
    hashes = [image_hash(p) for p in pictures]
    picks = zipf_choices(images, requests, seed)
    split = max(1, min(requests, round(requests * restart_fraction)))
    setup = time.perf_counter() - started

    cache = _open(source, tower)
    # Start from an empty cache so the numbers describe this run alone.
    removed = 0 if reuse else sum(cache.remove(h) for h in hashes)
    tiers = cache.tiers
    first = PhaseResult("before restart")
    second = PhaseResult("after restart")
    try:
        encodes = _serve(cache, tower, pictures, hashes, picks[:split], first, reporter)
    finally:
        cache.close()
    cache = _open(source, tower)
    try:
        encodes += _serve(cache, tower, pictures, hashes, picks[split:], second, reporter)
        verified = mismatched = 0
        for index in sorted(set(picks))[:verify]:
            cached = cache.get(hashes[index])
            fresh = tower.encode(pictures[index])
            verified += 1
            if cached is None or not _bit_equal(cached, fresh):
                mismatched += 1
    finally:
        cache.close()
    tokens, hidden = (IMAGE_SIZE // TOWER["patch_size"]) ** 2, TOWER["hidden_size"]
    phases = [p for p in (first, second) if p.requests]
    return DemoReport(
        images=images,
        requests=requests,
        seed=seed,
        config_source=cache.config.source,
        tiers=tiers,
        phases=phases,
        encode_count=encodes,
        encode_seconds=sum(p.encode_seconds for p in phases),
        cache_seconds=sum(p.cache_seconds for p in phases),
        setup_seconds=setup,
        verified=verified,
        mismatched=mismatched,
        tokens=tokens,
        hidden=hidden,
        removed_before=removed,
    )


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )
