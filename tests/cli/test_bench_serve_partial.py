"""``bench serve`` that stops partway (a server died, a request failed): the rows
measured before are still shown and written, marked as a run that stopped early,
and the command exits 1 naming why. The servers are replaced by a stand-in that
returns measured blocks, then fails, so the file runs in about a second."""

from __future__ import annotations

import json

from lmcache_ec.bench import serve, tiny_vlm
from lmcache_ec.bench.serve_rows import Block, Sample
from lmcache_ec.bench.vllm_server import ServerError

FAILURE = "server lmcache-disk on 127.0.0.1:1 died during a chat request"


class _FailingFleet:
    """Measures the first block on every server, then a server dies."""

    def __init__(self, settings, root, model, floor=None) -> None:
        self.floor_prompt, self.start_s, self.blocks_run = "a b c", {}, 0

    def start(self, names, progress) -> None:
        pass

    def stop(self, names=None) -> None:
        pass

    def run_block(self, names, pattern, mode, ids, repeat) -> list[Block]:
        if self.blocks_run:
            raise ServerError(FAILURE)
        self.blocks_run += 1
        samples = [
            Sample(image, again, 0.020, floor=0.015, round=number)
            for number, (image, again) in enumerate(zip(ids, repeat, strict=True))
        ]
        return [
            Block(
                subject,
                pattern,
                mode,
                samples=list(samples),
                floor_ttft=[0.015] * len(ids),
                busy_s=0.03 * len(ids),
                counters={"loads": 0.0, "saves": float(len(ids))},
            )
            for subject in names.values()
        ]


def test_a_run_that_stops_partway_keeps_the_rows_it_measured(invoke, tmp_path, monkeypatch):
    monkeypatch.setattr(serve, "Fleet", _FailingFleet)
    monkeypatch.setattr(tiny_vlm, "build_tiny_blip2", lambda root, seed: root)
    out = tmp_path / "serve.json"
    args = ["bench", "serve", "--subjects", "none,lmcache-disk", "--ratios", "0,100"]
    args += ["--lone", "6", "--concurrent", "0", "--no-restart", "--directory", tmp_path]
    result = invoke(*args, "--json", out, "--no-chart", expect=1)
    said = " ".join(result.output.split())  # as one line: the console wraps it
    assert f"stopped early, after the rows shown: {FAILURE}" in said
    data = json.loads(out.read_text())
    assert data["stopped"] == FAILURE
    assert {(r["subject"], r["pattern"]) for r in data["rows"]} == {
        ("none", "reuse 0 %"),
        ("lmcache-disk", "reuse 0 %"),
    }
    assert all(r["requests"] == 6 for r in data["rows"])
    assert "STOPPED EARLY" in said


def test_a_run_that_fails_before_any_row_is_an_error_without_a_report(
    invoke, tmp_path, monkeypatch
):
    class _DeadAtOnce(_FailingFleet):
        def run_block(self, *args) -> list[Block]:
            raise ServerError(FAILURE)

    monkeypatch.setattr(serve, "Fleet", _DeadAtOnce)
    monkeypatch.setattr(tiny_vlm, "build_tiny_blip2", lambda root, seed: root)
    out = tmp_path / "serve.json"
    args = ["bench", "serve", "--subjects", "none", "--ratios", "0", "--lone", "6"]
    args += ["--concurrent", "0", "--no-restart", "--directory", tmp_path]
    result = invoke(*args, "--json", out, "--no-chart", expect=1)
    assert FAILURE in " ".join(result.output.split()) and not out.exists()
