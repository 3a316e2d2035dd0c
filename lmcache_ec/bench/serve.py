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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .serve_rows import LMCACHE, SUBJECTS, Block, Sample, add_targets, pct, summarize
from .serve_timeline import (
    TimelineFile,
    intervals,
    read_timeline,
    request_events,
    summarize_intervals,
)
from .vllm_server import (
    CPU_ARGS,
    ChatResult,
    ServerError,
    VLLMServer,
    chat_with_image,
    ec_transfer_config,
    make_png,
    metric_total,
    png_data_url,
    read_metrics,
)

BATCHED_TOKENS = 128
IMAGE_TOKENS = 32  # the tiny BLIP-2's query tokens: one image = 32 embeddings
ENGINE_ARGS = (
    *CPU_ARGS,
    "--no-enable-prefix-caching",
    "--max-num-batched-tokens",
    str(BATCHED_TOKENS),
)
PROMPT = "describe the image"
TIMED_EXAMPLE_MODULE = "lmcache_ec.bench.timed_example"


@dataclass
class ServeSettings:
    subjects: tuple[str, ...] = tuple(SUBJECTS)
    ratios: tuple[int, ...] = (0, 50, 80, 100)
    lone: int = 12  # image requests per ratio, one at a time
    concurrent: int = 18  # image requests per ratio, in_flight at once: 6 rounds of 3
    in_flight: int = 3
    max_tokens: int = 8
    zipf_s: float = 1.1
    restart: bool = True
    seed: int = 0
    redis_url: str | None = None
    directory: str | None = None
    keep: bool = False
    ready_timeout: float = 420.0
    timeline: bool = True  # servers record per-request timelines (ec.timeline_path)
    settle_s: float | None = None  # between two servers' turns; None: settle_seconds()

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


def ec_config(
    subject: str, store: Path, redis_url: str | None, timeline: Path | None = None
) -> dict[str, Any] | None:
    """The subject's ``--ec-transfer-config``; ``timeline``: where it writes its
    per-request timeline (``ec.timeline_path``; the example through
    ``TimedExampleConnector``, which only records)."""
    recorded = {} if timeline is None else {"timeline_path": str(timeline)}
    if subject == "none":
        return None
    if subject == "example":
        return {
            "ec_connector": "TimedExampleConnector" if timeline else "ECExampleConnector",
            **({"ec_connector_module_path": TIMED_EXAMPLE_MODULE} if timeline else {}),
            "ec_role": "ec_both",
            "ec_connector_extra_config": {"shared_storage_path": str(store), **recorded},
        }
    if subject == "lmcache-disk":
        tiers = {"local_cpu": True, "max_local_cpu_size": 0.25, "local_disk": str(store)}
        return ec_transfer_config("ec_both", {**tiers, "max_local_disk_size": 1.0, **recorded})
    tiers = {"local_cpu": False, "remote_url": redis_url}
    return ec_transfer_config("ec_both", {**tiers, **recorded})


def request_failed(server: VLLMServer, what: str, exc: BaseException) -> ServerError:
    """A request the server did not answer, as the error ``bench serve`` reports: what
    failed and the server's log, not a traceback that loses the run."""
    return ServerError(
        f"{what} to {server.base_url} failed: {type(exc).__name__}: {exc}\n"
        f"log: {server.log_path}\n--- last lines ---\n{server.log_tail()}"
    )


def counters(server: VLLMServer) -> dict[str, float]:
    try:
        page = read_metrics(server.metrics_url)
    except OSError as exc:  # urllib's errors, a timeout included
        raise request_failed(server, "reading /metrics", exc) from exc
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


def settle_seconds() -> float:
    """The pause before a server's turn that follows another server's.

    vLLM's CPU engines run a worker process (the CPU platform forces the
    multiprocessing executor), and both it and the engine core poll their
    shared-memory queues with ``sched_yield`` for ``busy_loop_s`` (1 s) after
    their last message. On a small machine, where vLLM binds every CPU engine
    to the same core, the server that runs next shares that core with the
    previous one's polling: its step took up to ~1 s longer, whatever the
    connector. Waiting the polling out gives every request an idle machine,
    as one server per machine would (pinned by tests/upstream)."""
    import inspect

    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    busy_loop_s = inspect.signature(SpinCondition.__init__).parameters["busy_loop_s"].default
    return float(busy_loop_s) + 0.1


class Fleet:
    def __init__(self, settings: ServeSettings, root: Path, model: Path, floor: str | None = None):
        self.settings, self.root, self.model = settings, root, model
        self.servers: dict[str, VLLMServer] = {}
        self.floor_prompt = floor
        self.start_s: dict[str, float] = {}
        self.blocks_run = 0  # numbers each block's rows: only rows of one block pair up

    def timeline_path(self, name: str) -> Path:
        return self.root / "timelines" / f"{name}.jsonl"

    def start(self, names: dict[str, str], progress: Callable[[str], None]) -> None:
        """Start ``{server name: subject}`` together; a failure stops them all."""
        env = {name: None for name in os.environ if name.startswith("LMCACHE_EC_")}
        env["XDG_CACHE_HOME"] = str(self.root / "xdg")
        (self.root / "timelines").mkdir(parents=True, exist_ok=True)
        fresh = {}
        for name, subject in names.items():
            store = self.root / f"store-{subject}"
            timeline = self.timeline_path(name) if self.settings.timeline else None
            fresh[name] = VLLMServer(
                self.model,
                self.root / "logs" / f"{name}.log",
                ec_config=ec_config(subject, store, self.settings.redis_url, timeline),
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
        return self._chat(server, None, prompt, 2).ttft_s

    def ask(self, server: VLLMServer, image: int | None) -> ChatResult:
        png = None if image is None else make_png(image)
        prompt = PROMPT if image is not None else self.floor_prompt
        return self._chat(server, png, prompt, self.settings.max_tokens)

    def _chat(
        self, server: VLLMServer, png: bytes | None, prompt: str | None, max_tokens: int
    ) -> ChatResult:
        """One request; a failed or timed-out one is a ServerError with the server's log."""
        import httpx
        import openai

        try:
            return chat_with_image(server.base_url, server.served_model, png, prompt, max_tokens)
        except (openai.OpenAIError, httpx.HTTPError) as exc:  # neither is a RuntimeError
            raise request_failed(server, "a chat request", exc) from exc

    def run_block(
        self,
        names: dict[str, str],
        pattern: str | dict[str, str],
        mode: str,
        ids: list[int],
        repeat: list[bool],
    ) -> list[Block]:
        """The same images on every server of ``names`` ({server: subject}),
        interleaved: each request (lone) or each round of ``in_flight`` requests
        (concurrent) goes to every server back to back, in a rotating order, so
        the samples of two subjects pair up. A repeat is followed, on the same
        server, by a text-only request of the same length (its paired floor);
        ``pattern``: the rows' pattern, or one per server."""
        patterns = pattern if isinstance(pattern, dict) else dict.fromkeys(names, pattern)
        blocks = {n: Block(s, patterns[n], mode, self.blocks_run) for n, s in names.items()}
        self.blocks_run += 1
        before = {n: counters(self.servers[n]) for n in names}
        settle = self.settings.settle_s if self.settings.settle_s is not None else settle_seconds()
        last: tuple[str, float] | None = None  # the server that ran last, and when it ended
        order = list(names)
        size = 1 if mode == "lone" else self.settings.in_flight
        rounds = [list(range(i, min(i + size, len(ids)))) for i in range(0, len(ids), size)]
        for number, indices in enumerate(rounds):
            order = order[1:] + order[:1]  # nobody always goes first
            # Every repeat gets its floor; rows without repeats, every other round.
            floors = any(repeat[i] for i in indices) or number % 2 == 1
            for name in order:
                server, block = self.servers[name], blocks[name]
                if last is not None and last[0] != name:
                    time.sleep(max(0.0, last[1] + settle - time.monotonic()))
                begin = time.perf_counter()
                results = self._requests(server, [ids[i] for i in indices])
                wall = time.perf_counter() - begin
                block.busy_s += results[0].total_s if mode == "lone" else wall
                samples = [
                    Sample(
                        ids[i],
                        repeat[i],
                        r.ttft_s,
                        r.request_id,
                        r.sent_at,
                        r.first_token_at,
                        round=number,
                    )
                    for i, r in zip(indices, results, strict=True)
                ]
                if floors:
                    texts = self._requests(server, [None] * len(indices))
                    for sample, text in zip(samples, texts, strict=True):
                        sample.floor = text.ttft_s
                        block.floor_ttft.append(text.ttft_s)
                block.samples += samples
                last = (name, time.monotonic())
        for name, block in blocks.items():
            sent = len(ids) + len(block.floor_ttft)
            block.counters = settled(self.servers[name], before[name], sent)
            if self.settings.timeline:
                block.timeline = hit_timeline(block, read_timeline(self.timeline_path(name)))
        return list(blocks.values())

    def _requests(self, server: VLLMServer, images: list[int | None]) -> list[ChatResult]:
        if len(images) == 1:
            return [self.ask(server, images[0])]
        with ThreadPoolExecutor(len(images)) as pool:
            return list(pool.map(lambda image: self.ask(server, image), images))


def hit_timeline(block: Block, timeline: TimelineFile) -> dict[str, dict[str, float]]:
    """Median and p99 of each interval of the block's hits (its repeats; every
    request in a block without repeats)."""
    chosen = [s for s in block.samples if s.repeat] or block.samples
    return summarize_intervals(
        [
            intervals(request_events(timeline, s.request_id, s.sent_at, s.first_token_at))
            for s in chosen
        ]
    )


def floor_prompt(server: VLLMServer) -> str:
    """A text prompt with as many tokens as ``PROMPT`` plus one image (vLLM /tokenize)."""

    def count(content: Any) -> int:
        body = {"model": server.served_model, "messages": [{"role": "user", "content": content}]}
        request = urllib.request.Request(
            f"{server.base_url}/tokenize",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(json.loads(response.read())["count"])
        except OSError as exc:
            raise request_failed(server, "/tokenize", exc) from exc

    image = {"type": "image_url", "image_url": {"url": png_data_url(make_png(0))}}
    target = count([image, {"type": "text", "text": PROMPT}])
    words = target - count(PROMPT)
    prompt = " ".join([PROMPT, *(f"w{k}" for k in range(words))])
    if count(prompt) != target:
        raise RuntimeError(f"floor prompt has {count(prompt)} tokens, the image prompt {target}")
    return prompt


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
    stopped: str | None = None  # why the run ended before its last block
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
        except (ServerError, RuntimeError) as exc:
            if not blocks:  # nothing measured: the error is the whole answer
                raise
            # Hours of rows are not thrown away for one failed request: they are
            # reported, marked as a run that stopped early.
            stopped = str(exc)
        finally:
            fleet.stop()
            if not settings.keep:
                shutil.rmtree(root, ignore_errors=True)
    result = build_result(settings, blocks, fleet, command, time.monotonic() - began, root)
    result["stopped"] = stopped
    return result


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


__all__ = ["ServeSettings", "run_serve", "settle_seconds"]
