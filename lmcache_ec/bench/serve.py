"""``bench serve``: real ``vllm serve`` instances, a multimodal chat workload, TTFT.

One server per subject, started together, all fed the same request sequence
(interleaved request by request for lone requests, batch by batch for the
concurrent pattern), so machine load falls on every subject alike:

- subjects: no EC connector; vLLM's ``ECExampleConnector`` on a disk
  directory; lmcache-ec on disk (CPU + disk tiers); lmcache-ec on Redis only.
- patterns: reuse 0/50/80/100 % (a repeat is an image sent before, drawn from
  a Zipf law over first-sent rank; new images are fresh per ratio), then a
  cold restart (a fresh server on the same stores replays images the first
  one saw) and, for Redis, a second instance beside the first.
- modes: ``lone`` (one request at a time on an idle engine: Model Runner V1's
  hard case) and ``concurrent`` (``in_flight`` requests at once).
- floor: a text-only prompt with as many tokens as the image prompt, on the
  same server, interleaved with the image requests.

Every server runs with prefix caching off (a repeat would otherwise skip the
encoder on every subject) and ``--max-num-batched-tokens 128``, which sizes
vLLM's own in-process encoder cache to 4 images; a repeat is never one of the
last ``4 + in_flight`` images sent, so every repeat is a question to the EC
connector rather than to vLLM's own cache.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .vllm_server import (
    CPU_ARGS,
    VLLMServer,
    chat_with_image,
    ec_transfer_config,
    make_png,
    metric_total,
    png_data_url,
    read_metrics,
)

SUBJECTS = {
    "none": "no connector",
    "example": "ECExampleConnector (disk)",
    "lmcache-disk": "lmcache-ec (disk)",
    "lmcache-redis": "lmcache-ec (Redis)",
}
LMCACHE = ("lmcache-disk", "lmcache-redis")
BATCHED_TOKENS = 128
IMAGE_TOKENS = 32  # the tiny BLIP-2's query tokens: one image = 32 embeddings
ENGINE_ARGS = (
    *CPU_ARGS,
    "--no-enable-prefix-caching",
    "--max-num-batched-tokens",
    str(BATCHED_TOKENS),
)
PROMPT = "describe the image"
FLOOR_MAX = 1.2  # target: hit TTFT / floor


@dataclass
class ServeSettings:
    subjects: tuple[str, ...] = tuple(SUBJECTS)
    ratios: tuple[int, ...] = (0, 50, 80, 100)
    lone: int = 12  # image requests per ratio, one at a time
    concurrent: int = 12  # image requests per ratio, in_flight at once
    in_flight: int = 3
    max_tokens: int = 8
    zipf_s: float = 1.1
    restart: bool = True
    seed: int = 0
    redis_url: str | None = None
    directory: str | None = None
    keep: bool = False
    ready_timeout: float = 420.0

    @classmethod
    def quick_defaults(cls, **overrides: Any) -> ServeSettings:
        return cls(**{"lone": 6, "concurrent": 6, **overrides})


class Workload:
    """Image ids per block, the same for every subject; ids are PNG seeds."""

    def __init__(self, settings: ServeSettings) -> None:
        self.rng = np.random.default_rng(settings.seed)
        self.s = settings.zipf_s
        self.window = BATCHED_TOKENS // IMAGE_TOKENS + settings.in_flight
        self.sent: list[int] = []  # distinct ids, first-sent order (= Zipf rank)
        self.recent: list[int] = []  # ids in send order
        self.replayed: set[int] = set()  # sent to the fresh servers already
        self.next_id = 1000 * (settings.seed + 1)

    def _zipf(self, pool: list[int]) -> int:
        weights = 1.0 / np.arange(1, len(pool) + 1) ** self.s
        return pool[int(self.rng.choice(len(pool), p=weights / weights.sum()))]

    def block(self, ratio: int, n: int) -> tuple[list[int], list[bool]]:
        repeats = set(self.rng.choice(n, size=round(ratio * n / 100), replace=False).tolist())
        ids, flags = [], []
        for i in range(n):
            recent = set(self.recent[-self.window :])
            pool = [image for image in self.sent if image not in recent]
            repeat = i in repeats and bool(pool)
            if repeat:
                image = self._zipf(pool)
            else:
                image, self.next_id = self.next_id, self.next_id + 1
                self.sent.append(image)
            self.recent.append(image)
            ids.append(image)
            flags.append(repeat)
        return ids, flags

    def replay(self, n: int) -> list[int]:
        """``n`` distinct images already sent, Zipf-drawn (for a fresh server)."""
        pool, out = [image for image in self.sent if image not in self.replayed], []
        for _ in range(min(n, len(pool))):
            out.append(self._zipf(pool))
            pool.remove(out[-1])
        self.replayed.update(out)
        return out


def ec_config(subject: str, store: Path, redis_url: str | None) -> dict[str, Any] | None:
    if subject == "none":
        return None
    if subject == "example":
        return {
            "ec_connector": "ECExampleConnector",
            "ec_role": "ec_both",
            "ec_connector_extra_config": {"shared_storage_path": str(store)},
        }
    if subject == "lmcache-disk":
        tiers = {"local_cpu": True, "max_local_cpu_size": 0.25, "local_disk": str(store)}
        return ec_transfer_config("ec_both", {**tiers, "max_local_disk_size": 1.0})
    return ec_transfer_config("ec_both", {"local_cpu": False, "remote_url": redis_url})


def counters(server: VLLMServer) -> dict[str, float]:
    page = read_metrics(server.metrics_url)
    return {
        "loads": metric_total(page, "vllm:lmcache_ec_loads_total"),
        "saves": metric_total(page, "vllm:lmcache_ec_saves_total"),
        "tier_hits": metric_total(page, "vllm:lmcache_ec_hits_total"),
        "prefix_cached_tokens": metric_total(page, "vllm:prompt_tokens_cached_total"),
        "finished": metric_total(page, "vllm:request_success_total"),
    }


def settled(server: VLLMServer, before: dict[str, float], requests: int) -> dict[str, float]:
    """Counter deltas once ``requests`` more requests finished (stats lag a step)."""
    deadline = time.monotonic() + 15
    while True:
        now = counters(server)
        if now["finished"] - before["finished"] >= requests or time.monotonic() > deadline:
            time.sleep(0.5)
            now = counters(server)
            return {k: now[k] - before[k] for k in now}
        time.sleep(0.2)


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class Block:
    """One (subject, pattern, mode): what was sent and what came back."""

    subject: str
    pattern: str
    mode: str
    ttft: list[float] = field(default_factory=list)
    hit_ttft: list[float] = field(default_factory=list)  # requests for a repeat image
    miss_ttft: list[float] = field(default_factory=list)
    floor_ttft: list[float] = field(default_factory=list)
    busy_s: float = 0.0  # lone: summed request times; concurrent: batch wall time
    counters: dict[str, float] = field(default_factory=dict)


class Fleet:
    def __init__(self, settings: ServeSettings, root: Path, model: Path, floor: str | None = None):
        self.settings, self.root, self.model = settings, root, model
        self.servers: dict[str, VLLMServer] = {}
        self.floor_prompt = floor
        self.start_s: dict[str, float] = {}

    def start(self, names: dict[str, str], progress: Callable[[str], None]) -> None:
        """Start ``{server name: subject}`` together; a failure stops them all."""
        env = {name: None for name in os.environ if name.startswith("LMCACHE_EC_")}
        env["XDG_CACHE_HOME"] = str(self.root / "xdg")
        fresh = {}
        for name, subject in names.items():
            store = self.root / f"store-{subject}"
            fresh[name] = VLLMServer(
                self.model,
                self.root / "logs" / f"{name}.log",
                ec_config=ec_config(subject, store, self.settings.redis_url),
                extra_args=ENGINE_ARGS,
                env=env,
                ready_timeout=self.settings.ready_timeout,
            )
        self.servers.update(fresh)
        progress(f"starting {len(fresh)} vllm serve ({', '.join(fresh)}): about a minute each")
        for server in fresh.values():
            server.launch()
        for name, server in fresh.items():
            server.wait_ready()  # raises ServerError with the log tail
            self.start_s[name] = round(server.started_s or 0.0, 1)
        for server in fresh.values():  # a process's first forward is slow: not data
            self.text(server, PROMPT)
        if self.floor_prompt is None:
            self.floor_prompt = floor_prompt(next(iter(fresh.values())))

    def stop(self, names: list[str] | None = None) -> None:
        for name in names if names is not None else list(self.servers):
            self.servers.pop(name).stop()

    def text(self, server: VLLMServer, prompt: str) -> float:
        return chat_with_image(server.base_url, server.served_model, None, prompt, 2).ttft_s

    def ask(self, server: VLLMServer, image: int | None) -> tuple[float, float]:
        png = None if image is None else make_png(image)
        prompt = PROMPT if image is not None else self.floor_prompt
        result = chat_with_image(
            server.base_url, server.served_model, png, prompt, self.settings.max_tokens
        )
        return result.ttft_s, result.total_s

    def run_block(
        self,
        names: dict[str, str],
        pattern: str | dict[str, str],
        mode: str,
        ids: list[int],
        repeat: list[bool],
    ) -> list[Block]:
        """The same images on every server of ``names`` ({server: subject});
        ``pattern``: the rows' pattern, or one per server."""
        patterns = pattern if isinstance(pattern, dict) else dict.fromkeys(names, pattern)
        blocks = {n: Block(s, patterns[n], mode) for n, s in names.items()}
        before = {n: counters(self.servers[n]) for n in names}
        order = list(names)
        floors = max(2, len(ids) // 2)
        if mode == "lone":
            for i, image in enumerate(ids):
                order = order[1:] + order[:1]  # nobody always goes first
                for name in order:
                    ttft, total = self.ask(self.servers[name], image)
                    self._record(blocks[name], ttft, repeat[i])
                    blocks[name].busy_s += total
                    if i % 2 == 1 and len(blocks[name].floor_ttft) < floors:
                        blocks[name].floor_ttft.append(self.ask(self.servers[name], None)[0])
        else:
            for name in order[len(ids) % len(order) :] + order[: len(ids) % len(order)]:
                server, block = self.servers[name], blocks[name]
                begin = time.perf_counter()
                results = self._concurrent(server, ids)
                block.busy_s = time.perf_counter() - begin
                for (ttft, _), hit in zip(results, repeat, strict=True):
                    self._record(block, ttft, hit)
                texts = [None] * max(self.settings.in_flight, floors)
                block.floor_ttft = [t for t, _ in self._concurrent(server, texts)]
        for name, block in blocks.items():
            sent = len(ids) + len(block.floor_ttft)
            block.counters = settled(self.servers[name], before[name], sent)
        return list(blocks.values())

    def _concurrent(self, server: VLLMServer, images: list[int | None]) -> list[tuple]:
        with ThreadPoolExecutor(self.settings.in_flight) as pool:
            return list(pool.map(lambda image: self.ask(server, image), images))

    @staticmethod
    def _record(block: Block, ttft: float, repeat: bool) -> None:
        block.ttft.append(ttft)
        (block.hit_ttft if repeat else block.miss_ttft).append(ttft)


def floor_prompt(server: VLLMServer) -> str:
    """A text prompt with as many tokens as ``PROMPT`` plus one image (vLLM /tokenize)."""

    def count(content: Any) -> int:
        body = {"model": server.served_model, "messages": [{"role": "user", "content": content}]}
        request = urllib.request.Request(
            f"{server.base_url}/tokenize",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(json.loads(response.read())["count"])

    image = {"type": "image_url", "image_url": {"url": png_data_url(make_png(0))}}
    target = count([image, {"type": "text", "text": PROMPT}])
    words = target - count(PROMPT)
    prompt = " ".join([PROMPT, *(f"w{k}" for k in range(words))])
    if count(prompt) != target:
        raise RuntimeError(f"floor prompt has {count(prompt)} tokens, the image prompt {target}")
    return prompt


def summarize(block: Block, floor: float | None, miss_ref: float | None) -> dict[str, Any]:
    repeats = len(block.hit_ttft)
    if block.subject in LMCACHE:
        hits = int(block.counters.get("loads", 0))
    else:
        hits = repeats if block.subject == "example" else 0
    hit_p50 = pct(block.hit_ttft, 50)
    row = {
        "subject": block.subject,
        "label": SUBJECTS[block.subject],
        "pattern": block.pattern,
        "mode": block.mode,
        "requests": len(block.ttft),
        "repeats": repeats,
        "hits": hits,
        "hits_source": "counter" if block.subject in LMCACHE else "assumed",
        "encodes": int(block.counters["saves"]) if block.subject in LMCACHE else None,
        "ttft_p50_ms": _ms(pct(block.ttft, 50)),
        "ttft_p99_ms": _ms(pct(block.ttft, 99)),
        "hit_ttft_p50_ms": _ms(hit_p50),
        "miss_ttft_p50_ms": _ms(pct(block.miss_ttft, 50)),
        "floor_ttft_p50_ms": _ms(floor),
        "requests_per_s": round(len(block.ttft) / block.busy_s, 3) if block.busy_s else None,
        "hit_over_floor": round(hit_p50 / floor, 3) if hit_p50 and floor else None,
        "encoder_s_saved": (
            round(max(miss_ref - hit_p50, 0.0) * hits, 3)
            if hits and hit_p50 is not None and miss_ref is not None
            else 0.0
        ),
        "counters": {k: round(v, 6) for k, v in block.counters.items()},
        "ttft_ms": [round(t * 1000, 2) for t in block.ttft],
    }
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def add_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark lmcache-ec rows with hits: hit ≤ 1.2x floor, hit ≤ ECExampleConnector's."""
    example = {(r["pattern"], r["mode"]): r for r in rows if r["subject"] == "example"}
    results = []
    for row in rows:
        row["targets"] = []
        if row["subject"] not in LMCACHE or not row["repeats"]:
            continue
        ratio = row["hit_over_floor"]
        row["targets"].append(
            {
                "text": f"hit TTFT ≤ {FLOOR_MAX}x text floor",
                "value": ratio,
                "pass": None if ratio is None else ratio <= FLOOR_MAX,
            }
        )
        pattern = row["pattern"] if row["pattern"] != "2nd instance" else "cold restart"
        other = example.get((pattern, row["mode"]))
        versus = None
        if other and other["hit_ttft_p50_ms"] and row["hit_ttft_p50_ms"]:
            versus = round(row["hit_ttft_p50_ms"] / other["hit_ttft_p50_ms"], 3)
        row["vs_example"] = versus
        row["targets"].append(
            {
                "text": "hit TTFT ≤ ECExampleConnector's",
                "value": versus,
                "pass": None if versus is None else versus <= 1.0,
            }
        )
        for target in row["targets"]:
            results.append({"subject": row["subject"], "pattern": row["pattern"], **target})
    return results


def run_serve(
    settings: ServeSettings, progress: Callable[[str], None], command: str = ""
) -> dict[str, Any]:
    """Run every phase; returns the JSON-ready result (see ``summarize``)."""
    import contextlib

    from .servers import local_redis
    from .tiny_vlm import build_tiny_blip2

    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="lmcache-ec-serve-", dir=settings.directory))
    blocks: list[Block] = []
    fleet: Fleet | None = None
    with contextlib.ExitStack() as stack:
        if "lmcache-redis" in settings.subjects and settings.redis_url is None:
            progress("starting redis-server")
            settings.redis_url = stack.enter_context(local_redis())
        progress("building the tiny BLIP-2 model")
        model = build_tiny_blip2(root / "models", seed=0)
        workload = Workload(settings)
        fleet = Fleet(settings, root, model)
        try:
            first = {s: s for s in settings.subjects}
            fleet.start(first, progress)
            for ratio in settings.ratios:
                for mode, n in (("lone", settings.lone), ("concurrent", settings.concurrent)):
                    if n:
                        progress(f"reuse {ratio} %, {mode}: {n} requests x {len(first)} servers")
                        ids, repeat = workload.block(ratio, n)
                        blocks += fleet.run_block(first, f"reuse {ratio} %", mode, ids, repeat)
            later = {
                f"{s}-2" if s == "lmcache-redis" else f"{s}-restarted": s
                for s in settings.subjects
                if s in ("example", *LMCACHE)
            }
            if settings.restart and later:
                fleet.stop([s for s in first if s != "lmcache-redis"])  # SIGTERM: flushes
                fleet.start(later, progress)
                for mode, n in (("lone", settings.lone), ("concurrent", settings.concurrent)):
                    if n:
                        progress(f"cold restart / 2nd instance, {mode}: {n} requests")
                        ids = workload.replay(n)
                        patterns = {
                            name: "2nd instance" if name.endswith("-2") else "cold restart"
                            for name in later
                        }
                        blocks += fleet.run_block(later, patterns, mode, ids, [True] * len(ids))
        finally:
            fleet.stop()
            if not settings.keep:
                shutil.rmtree(root, ignore_errors=True)
    return build_result(settings, blocks, fleet, command, time.monotonic() - began, root)


def build_result(
    settings: ServeSettings,
    blocks: list[Block],
    fleet: Fleet,
    command: str,
    elapsed: float,
    root: Path,
) -> dict[str, Any]:
    floors: dict[tuple[str, str], list[float]] = {}
    for block in blocks:
        floors.setdefault((block.subject, block.mode), []).extend(block.floor_ttft)
    misses = {(b.subject, b.mode): pct(b.miss_ttft, 50) for b in blocks if b.pattern == "reuse 0 %"}
    rows = [
        summarize(b, pct(floors[(b.subject, b.mode)], 50), misses.get((b.subject, b.mode)))
        for b in blocks
    ]
    targets = add_targets(rows)
    import torch
    import vllm

    return {
        "command": command,
        "settings": {**asdict(settings), "redis_url": "(local)" if settings.redis_url else None},
        "engine_args": list(ENGINE_ARGS),
        "floor_prompt_words": len(fleet.floor_prompt.split()) if fleet.floor_prompt else None,
        "rows": rows,
        "targets": targets,
        "start_s": fleet.start_s,
        "elapsed_s": round(elapsed, 1),
        "kept": str(root) if settings.keep else None,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "vllm": vllm.__version__,
            "platform": platform.platform(),
        },
    }


__all__ = ["SUBJECTS", "ServeSettings", "run_serve"]
