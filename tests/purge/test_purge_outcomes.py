"""A purge says what it did, and what it did stays done.

- remote deletes the store refuses (no delete permission, a read-only
  replica, a timeout) end the purge with one warning and exit 1, never with
  "deleted" and the claim that running engines stop serving the entries;
- a purge recorded while an engine's remote tier was down is not undone by
  the re-sending of that outage's writes, even while the engine's watch
  thread is still applying it;
- a purge whose record could not be appended names the namespaces left
  untold and the command that tells each; without ``--namespace`` it also
  records in every namespace that has a purge log on the disk tier;
- a record dated far ahead of the reader's clock is rejected (logged once),
  not applied again by every engine that starts before its time.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
import torch

from lmcache_ec.config import load_config
from lmcache_ec.key import slug
from lmcache_ec.purge import marker as marker_module
from lmcache_ec.purge import selection
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import (
    FUTURE_LIMIT_S,
    BadRecord,
    PurgeMarker,
    append_disk,
    append_remote,
    log_name,
    read_disk,
    records,
)
from lmcache_ec.remote.catalog import open_catalog
from tests.cli.conftest import invoke, populate, runner, write_config

__all__ = ["invoke", "runner"]  # CLI fixtures, used by name

MODEL = "org/purged"
INTERVAL = 0.2  # purge_check_s of the engines here
TENSOR = torch.ones(4, 8, dtype=torch.bfloat16)


def _wait_for(condition, what: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _said(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def _frames(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(match="ec1.*kv_bytes"))


def _remote_yaml(path, url: str) -> str:
    return write_config(
        path, local_cpu=True, max_local_cpu_size=0.0625, remote_url=url, remote_timeout=2.0
    )


def _user(server, name: str, *refused: str) -> str:
    """The URL of a Redis user who may do everything but ``refused``."""
    server.client().acl_setuser(
        name,
        enabled=True,
        passwords=["+pw"],
        keys="*",
        commands=["+@all", *(f"-{command}" for command in refused)],
    )
    return f"redis://{name}:pw@127.0.0.1:{server.port}"


# -- deletes the store refuses ---------------------------------------------------


def test_a_purge_whose_remote_deletes_fail_exits_1_and_claims_nothing(
    tmp_path, redis_process, invoke
):
    """A user without DEL (a read-only replica after a failover, an S3 key
    without s3:DeleteObject): the entries stay, and the purge says so."""
    config = _remote_yaml(tmp_path / "admin.yaml", redis_process.url)
    populate(config, MODEL, "default", 3)
    client = redis_process.client()
    without_del = _user(redis_process, "purger", "del", "unlink")
    refused = _remote_yaml(tmp_path / "purger.yaml", without_del)

    said = _said(invoke("purge", "--config", refused, "--model", MODEL, expect=1))
    assert "Traceback" not in said
    assert said.count("remote: cannot delete") == 1  # one warning, not one per entry
    assert "3 selected entries left in place there, still served" in said
    assert "stop serving" not in said
    assert len(_frames(client)) == 3
    assert client.info("commandstats")["cmdstat_del"]["rejected_calls"] == 1  # not asked again

    said = _said(invoke("purge", "--config", config, "--model", MODEL))
    assert "remote: deleted 3 entries" in said and "stop serving" in said
    assert _frames(client) == []


def test_a_strict_delete_raises_a_store_failure_and_answers_false_for_a_missing_entry(
    tmp_path, redis_process
):
    config = _remote_yaml(tmp_path / "admin.yaml", redis_process.url)
    populate(config, MODEL, "default", 1)
    (frame,) = _frames(redis_process.client())
    name = frame.decode().removesuffix("kv_bytes")
    refused = {"remote_url": _user(redis_process, "purger", "del"), "remote_timeout": 2.0}
    with open_catalog(load_config(refused)) as catalog:
        assert catalog.delete(name) is False  # the lenient form: "absent or on error"
        with pytest.raises(redis.exceptions.NoPermissionError):
            catalog.delete(name, strict=True)
    with open_catalog(load_config({**refused, "remote_url": redis_process.url})) as catalog:
        assert catalog.delete(name, strict=True) is True
        assert catalog.delete(name, strict=True) is False


# -- an outage's writes re-sent while a purge is being applied --------------------


def test_a_replay_waits_for_the_purge_the_watch_thread_is_still_applying(
    disk_dir, redis_url, monkeypatch, make_cache
):
    """The watch thread has taken the purge and is scanning the engine's disk
    (held here, as a big directory would hold it) when the remote tier comes
    back: the replay must not take "seen" for "applied" and re-send x."""
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "remote_url": redis_url,
        "remote_timeout": 1.0,
        "purge_check_s": INTERVAL,
    }
    with make_cache({**config, "remote_url": None}, model=MODEL) as writer:
        assert writer.put("x", TENSOR) and writer.flush(30)  # on the shared disk only
    engine = make_cache(config, model=MODEL)
    key = engine.key("x")
    remote = next(tier for tier in engine._storage.tiers() if tier.name == "remote")

    scanning, release = threading.Event(), threading.Event()
    scan = selection.scan_disk

    def held_scan(*args, **kwargs):
        if threading.current_thread().name == "ec-purge-watch":
            scanning.set()
            release.wait(30)
        return scan(*args, **kwargs)

    monkeypatch.setattr(selection, "scan_disk", held_scan)

    def replaying() -> bool:
        return any(t.name == "ec-remote-replay" for t in threading.enumerate())

    with open_catalog(load_config(config)) as catalog:
        try:
            # Recorded during the outage, in which x was written (so never uploaded).
            record = PurgeMarker.new(Selector(model=MODEL)).to_line()
            append_remote(catalog, slug("default"), record)
            assert scanning.wait(20), "the watch thread never began applying the purge"
            remote.remember_missed([key])
            engine._replayer.start(remote)  # the store answers again
            deadline = time.monotonic() + 1.0  # the re-send, if it comes, comes at once
            while replaying() and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            release.set()
        _wait_for(lambda: not replaying(), "the replay's end")
        assert engine.flush(10)
        assert remote.counters["resent"] == 0
        assert catalog.lookup(key.storage_name) is False  # the purge is not undone
        assert engine.stats.snapshot()["purges_seen"] == 1
    assert engine.get("x") is None


# -- who is told -------------------------------------------------------------------


def test_a_purge_whose_record_failed_names_the_untold_namespaces_and_how_to_tell_them(
    tmp_path, redis_process, monkeypatch, invoke, make_cache
):
    """Run again as the warning says, the purge reaches tenant-b's running
    engine, though its entries were deleted by the first run."""
    monkeypatch.chdir(tmp_path)  # a short --config in the command said
    url = redis_process.url
    config = {"local_cpu": True, "max_local_cpu_size": 0.05, "remote_url": url}
    engine = make_cache(config, model=MODEL, namespace="tenant-b", purge_check_s=INTERVAL)
    for i in range(3):
        assert engine.put(f"img-{i}", TENSOR)
    assert engine.flush(30)
    client = redis_process.client()
    _remote_yaml(tmp_path / "purger.yaml", _user(redis_process, "purger", "eval", "evalsha"))

    said = _said(invoke("purge", "--config", "purger.yaml", "--model", MODEL, expect=1))
    assert "remote: deleted 3 entries" in said
    assert "engines of the namespaces default, tenant-b were not told" in said
    told = (
        f"lmcache-ec purge --config purger.yaml --model {MODEL} --namespace tenant-b --tier remote"
    )
    assert told in said
    assert "stop serving" not in said
    assert _frames(client) == [] and engine.get("img-0") is not None  # deleted, still served

    client.execute_command("ACL", "SETUSER", "purger", "+eval", "+evalsha")  # answers again
    invoke(*told.split()[1:])
    assert client.exists(log_name("tenant-b"))
    _wait_for(lambda: engine.get("img-0") is None, "tenant-b's engine told")


def test_a_purge_without_namespace_records_in_each_namespace_with_a_disk_log(
    tmp_path, disk_dir, invoke
):
    """tenant-b has no entry left (a purge deleted them, its record failed),
    but its engines listen to its log: a purge of the model tells them too."""
    config = write_config(
        tmp_path / "disk.yaml", local_cpu=True, max_local_cpu_size=0.0625, local_disk=str(disk_dir)
    )
    populate(config, MODEL, "default", 2)
    earlier = PurgeMarker.new(Selector(model="org/another")).to_line()
    append_disk(str(disk_dir), slug("tenant-b"), earlier)

    said = _said(invoke("purge", "--config", config, "--model", MODEL, "--tier", "disk"))
    assert "disk: deleted 2 entries" in said
    (_, before, after) = _parsed(read_disk(str(disk_dir), "tenant-b"), "tenant-b")
    assert before.model == after.model == MODEL
    assert _parsed(read_disk(str(disk_dir), "default"), "default") == [before, after]


def _parsed(log: bytes | None, namespace: str) -> list[PurgeMarker]:
    return [PurgeMarker.parse(line, namespace, time.time()) for line in records(log)]


KILLED_PURGER = """
import os, signal, sys
from lmcache_ec.cli import main, purge_entries
delete = purge_entries._delete
def delete_then_die(*args):
    delete(*args)
    os.kill(os.getpid(), signal.SIGKILL)  # before the record that follows the deletes
purge_entries._delete = delete_then_die
sys.argv = ["lmcache-ec", "purge", "--config", sys.argv[1], "--model", sys.argv[2]]
main()
"""


def test_a_purge_killed_after_its_deletes_has_told_every_namespace_it_reached(
    tmp_path, disk_dir, make_cache
):
    """Killed before its last record, the purge has recorded once before its
    deletes: tenant-b's engine stops serving (a rerun would find no entry of
    tenant-b left, so could not tell it), and its two records count one purge."""
    config = {"local_cpu": True, "max_local_cpu_size": 0.05, "local_disk": str(disk_dir)}
    engine = make_cache(config, model=MODEL, namespace="tenant-b", purge_check_s=INTERVAL)
    assert engine.put("img", TENSOR) and engine.flush(30)
    purger = write_config(tmp_path / "purger.yaml", **config)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_PURGER, purger, MODEL], capture_output=True, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not [name for name in os.listdir(disk_dir) if name.endswith(".pt")]  # deleted
    _wait_for(lambda: engine.get("img") is None, "tenant-b's engine told")
    assert engine.stats.snapshot()["purges_seen"] == 1


def test_a_purge_behind_a_stopped_purger_ends_naming_the_untold_namespaces(
    tmp_path, disk_dir, monkeypatch, invoke
):
    """A purger stopped (SIGSTOP) while it appends holds the directory's lock
    for good: the next purge waits ``APPEND_LOCK_S``, then says whom it did not
    tell and how to tell them (exit 1), never waits for good."""
    monkeypatch.setattr(marker_module, "APPEND_LOCK_S", 0.2)
    monkeypatch.chdir(tmp_path)  # a short --config in the command said: not wrapped
    config = write_config(
        tmp_path / "disk.yaml", local_cpu=True, max_local_cpu_size=0.0625, local_disk=str(disk_dir)
    )
    config = "disk.yaml"
    populate(config, MODEL, "default", 1)
    stopped = os.open(disk_dir, os.O_RDONLY | os.O_DIRECTORY)  # another open description
    try:
        fcntl.flock(stopped, fcntl.LOCK_EX)
        said = _said(invoke("purge", "--config", config, "--model", MODEL, expect=1))
    finally:
        os.close(stopped)
    assert "disk: deleted 1 entries" in said
    assert "locked for over 0.2 s" in said
    assert "engines of the namespaces default were not told" in said
    assert f"lmcache-ec purge --config {config} --model {MODEL} --namespace default" in said


# -- records from the future ---------------------------------------------------------


def test_a_record_a_little_ahead_of_the_clock_is_clamped_and_one_far_ahead_rejected():
    now = time.time()
    near = PurgeMarker("ab", now + FUTURE_LIMIT_S / 2, None, MODEL).to_line()
    assert PurgeMarker.parse(near, "a", now=now).time == now
    for ahead in (FUTURE_LIMIT_S + 1, 86400, 1e12):
        line = PurgeMarker("ab", now + ahead, None, MODEL).to_line()
        with pytest.raises(BadRecord, match="ahead of this host's clock"):
            PurgeMarker.parse(line, "a", now=now)


def test_a_record_dated_a_day_ahead_purges_nothing_written_after_it(disk_dir, caplog, make_cache):
    """The purger's clock ran a day ahead: an engine started later must not
    take the record for a new purge and delete the entries written since."""
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "purge_check_s": INTERVAL,
    }
    ahead = PurgeMarker(PurgeMarker.new(Selector()).generation, time.time() + 86400, None, MODEL)
    append_disk(str(disk_dir), slug("default"), ahead.to_line())
    with make_cache(config, model=MODEL) as writer:
        assert writer.put("after", TENSOR) and writer.flush(10)
    path = os.path.join(disk_dir, writer.key("after").storage_name + ".pt")
    caplog.set_level(logging.WARNING, logger="lmcache_ec.purge.marker")
    caplog.clear()  # the writer's own warning

    engine = make_cache(config, model=MODEL)
    watch = engine._purges.watch
    seen = engine.stats.snapshot
    _wait_for(lambda: watch.bad_records or seen()["purges_seen"], "the record read")
    assert seen()["purges_seen"] == 0 and watch.bad_records == 1
    assert os.path.exists(path) and engine.get("after") is not None
    warned = [r for r in caplog.records if "ahead of this host's clock" in r.getMessage()]
    assert len(warned) == 1  # once, however often the log is read


def test_a_record_ahead_in_a_disk_log_is_taken_once_the_clock_reaches_it(
    disk_dir, make_cache, monkeypatch
):
    """The purger's clock runs ahead by more than the limit: the record waits,
    and a disk log is read again until this clock is near its time (it was read
    once and its purge never applied, the entries served until the log changed)."""
    monkeypatch.setattr(marker_module, "FUTURE_LIMIT_S", 0.5)  # the limit, shortened
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "purge_check_s": INTERVAL,
    }
    engine = make_cache(config, model=MODEL)
    assert engine.put("img", TENSOR) and engine.flush(10)
    ahead = PurgeMarker(PurgeMarker.new(Selector()).generation, time.time() + 2.0, None, MODEL)
    append_disk(str(disk_dir), slug("default"), ahead.to_line())
    watch = engine._purges.watch
    _wait_for(lambda: watch.bad_records == 1, "the record read, and left waiting")
    assert engine.stats.snapshot()["purges_seen"] == 0
    _wait_for(lambda: engine.stats.snapshot()["purges_seen"] == 1, "the record taken")
    assert engine.get("img") is None
    assert watch.bad_records == 1  # counted once, however often it was read
