"""Where ``ec.timeline_path`` points never stalls the engine step writing to it.

- a FIFO (no reader yet, or a reader that stopped reading), a character device:
  the timeline is off at the first write, with one warning; the write returns
  at once instead of blocking the scheduler's or a worker's step;
- threads writing their first lines at once open the file once (no fd leaked);
- a file renamed away (logrotate's ``create`` mode) or removed: the next line
  after the check goes to a new file at the path.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from lmcache_ec.integration.vllm.timeline import SchedulerTimeline, TimelineWriter, WorkerTimeline

LOGGER = "lmcache_ec.integration.vllm.timeline"
BOUND_S = 10.0  # far past any write to a regular file; only a blocked one reaches it


def _returns(fn: Callable[[], None]) -> bool:
    """Whether ``fn`` returns within BOUND_S (run aside, so a blocked write cannot hang us)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    return not thread.is_alive()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_fifo_without_a_reader_turns_the_timeline_off_without_blocking_the_scheduler(
    tmp_path, caplog
):
    fifo = tmp_path / "timeline.jsonl"
    os.mkfifo(fifo)
    timeline = SchedulerTimeline(str(fifo))
    requests = [
        SimpleNamespace(
            request_id=f"r{i}",
            arrival_time=time.time(),
            mm_features=[SimpleNamespace(identifier="i")],
        )
        for i in range(3)
    ]

    def finish_all() -> None:
        for request in requests:
            timeline.seen(request.request_id)
            timeline.item("i", "lookup")
            timeline.finished(request)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _returns(finish_all)
    (warning,) = _warnings(caplog)
    assert "Timeline off" in warning and "a FIFO with no reader" in warning
    timeline.close()


def test_a_fifo_whose_reader_stopped_reading_never_blocks_a_worker_step(tmp_path, caplog):
    fifo = tmp_path / "timeline.jsonl"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read
    try:
        timeline = WorkerTimeline(str(fifo), rank=0)

        def load_many() -> None:  # far more than a pipe's 64 KiB buffer
            for i in range(20_000):
                timeline.item(f"item-{i}", "loaded")

        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert _returns(load_many)
        (warning,) = _warnings(caplog)
        assert "not a regular file (a FIFO)" in warning
        timeline.close()
    finally:
        os.close(reader)


def test_a_character_device_is_refused_with_one_warning(caplog):
    writer = TimelineWriter(os.devnull)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        writer.write({"a": 1})
        writer.write({"a": 2})
    (warning,) = _warnings(caplog)
    assert "not a regular file (a character device)" in warning


def _fds_on(path: str) -> int:
    """This process's open descriptors on ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
    return count


def _first_lines_at_once(writer: TimelineWriter, threads: int) -> None:
    """``threads`` threads released together, each writing one line."""
    start = threading.Barrier(threads)

    def first_line(rank: int) -> None:
        start.wait()
        writer.write({"item": "a", "rank": rank, "loaded": 0.0})

    running = [threading.Thread(target=first_line, args=(r,)) for r in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(BOUND_S)


def test_threads_writing_their_first_lines_at_once_open_the_file_once(tmp_path):
    path = str(tmp_path / "timeline.jsonl")
    for attempt in range(20):  # each a fresh writer: a fresh race to open the file
        writer = TimelineWriter(path)
        _first_lines_at_once(writer, threads=8)
        writer.close()
        assert _fds_on(path) == 0, f"attempt {attempt}: a descriptor leaked"
    with open(path) as stream:
        assert sum(1 for _ in stream) == 20 * 8


@pytest.mark.parametrize("rotate", ["rename-and-create", "rename", "remove"])
def test_a_rotated_timeline_goes_on_in_a_new_file_at_the_path(tmp_path, rotate):
    path = tmp_path / "timeline.jsonl"
    writer = TimelineWriter(str(path), reopen_check_s=0.0)  # check at every line
    writer.write({"n": 1})
    if rotate == "remove":
        path.unlink()
    else:
        path.rename(tmp_path / "timeline.jsonl.1")
        if rotate == "rename-and-create":
            path.touch()
    writer.write({"n": 2})
    writer.write({"n": 3})
    writer.close()
    assert path.read_text() == '{"n":2}\n{"n":3}\n'
    if rotate != "remove":
        assert (tmp_path / "timeline.jsonl.1").read_text() == '{"n":1}\n'
