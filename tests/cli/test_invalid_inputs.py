"""What a user or a store can hand the CLI that it must not trip over.

- text from configs, paths, errors and stored headers is printed as it is,
  never read as Rich markup (``[/db]`` in a URL hint is no closing tag);
- invalid usage or configuration (an empty key, a timeout past any use, a
  ``--metrics-url`` that is no URL, a duration that is no finite number, a
  reference file that is not UTF-8) exits 2 with a message, never a traceback;
- an entry whose checksum-valid header holds a ``created`` that is no number
  is listed as unreadable and aged by its file, never a crash.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import xxhash

from lmcache_ec import codec
from lmcache_ec.purge.marker import PurgeMarker
from lmcache_ec.purge.selection import Entry, Selector

from .conftest import populate, write_config


@pytest.fixture
def wide(monkeypatch):
    """Both consoles at 400 columns: one line per table row and message."""
    from lmcache_ec.cli.common import console, err_console

    monkeypatch.setattr(console, "width", 400)
    monkeypatch.setattr(err_console, "width", 400)


def _usage_error(result) -> str:
    """Exit 2 through the command's own error path; the output, whitespace undone."""
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return "".join(result.output.split())


# -- never markup ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "shown"),
    [
        ("LMCACHE_EC_REMOTE_URL", "redis://cache.internal:6379x", "host:port[/db]"),
        ("LMCACHE_EC_READ_THREADS", "[/x]", "'[/x]'"),
        ("LMCACHE_EC_READ_THREADS", "[red]", "'[red]'"),
    ],
)
def test_a_config_error_is_printed_as_it_is(
    config_file, invoke, wide, monkeypatch, variable, value, shown
):
    monkeypatch.setenv(variable, value)
    said = _usage_error(invoke("ls", "--config", config_file, expect=None))
    assert variable in said and shown in said


def test_a_config_path_that_looks_like_markup_is_printed_as_it_is(tmp_path, invoke, wide):
    said = _usage_error(invoke("ls", "--config", tmp_path / "[/]nope.yaml", expect=None))
    assert "configfilenotfound" in said and "[/]nope.yaml" in said


def test_ls_prints_stored_names_that_look_like_markup_as_they_are(config_file, invoke, wide):
    populate(config_file, "[red]model", "[/y]ns", 1)
    out = invoke("ls", "--config", config_file).stdout
    assert "[/y]ns" in out and "[red]model" in out


def test_a_warning_naming_a_path_that_looks_like_markup_is_printed_as_it_is(tmp_path, invoke, wide):
    (tmp_path / "[").mkdir()
    blocker = tmp_path / "[" / "x]a-file"  # its path holds "[/x]"
    blocker.write_text("not a directory")
    config = write_config(tmp_path / "c.yaml", local_disk=str(blocker))
    result = invoke("ls", "--config", config, expect=1)
    assert "Traceback" not in result.output
    assert "[/x]a-file:Notadirectory" in "".join(result.output.split())


def test_doctor_prints_a_path_that_looks_like_markup_as_it_is(tmp_path, invoke, wide):
    blocker = tmp_path / "[bold]a-file"
    blocker.write_text("not a directory")
    config = write_config(tmp_path / "c.yaml", local_disk=str(blocker / "store"))
    out = invoke("doctor", "--config", config, "--no-round-trip", expect=1).stdout
    assert f"cannot create {blocker}/store" in out


# -- invalid usage or configuration: exit 2 --------------------------------------


@pytest.mark.parametrize(
    ("command", "key"),
    [(("ls",), "max_local_cpu_size"), (("purge", "--all"), "namespace"), (("doctor",), "node_dir")],
    ids=["ls", "purge", "doctor"],
)
def test_a_key_left_empty_is_a_usage_error(tmp_path, disk_dir, invoke, wide, command, key):
    path = tmp_path / "c.yaml"
    path.write_text(f"ec:\n  local_disk: {disk_dir}\n  {key}:\n")
    said = _usage_error(invoke(*command, "--config", path, expect=None))
    assert f"ec.{key}:'{key}'mustbeset" in said


def test_doctor_refuses_a_timeout_past_any_use(tmp_path, disk_dir, invoke, wide):
    """1e300 seconds overflowed the doctor's bounded waits (threading's limit)."""
    config = write_config(tmp_path / "c.yaml", local_disk=str(disk_dir), close_timeout=1e300)
    said = _usage_error(invoke("doctor", "--config", config, expect=None))
    assert "'close_timeout'mustbeatmost86400" in said


@pytest.mark.parametrize(
    "url", ["http://[bad/metrics", "http://localhost:abc/metrics", "http://a b/metrics"]
)
def test_a_metrics_url_that_is_no_url_is_a_usage_error(config_file, invoke, url):
    said = _usage_error(invoke("stats", "--config", config_file, "--metrics-url", url, expect=None))
    assert "invalid--metrics-url" in said


@pytest.mark.parametrize(
    "url", ["http://admin:s3cretPW@127.0.0.1:1/metrics", "http://admin:s3cretPW@h:abc/metrics"]
)
def test_a_metrics_url_with_credentials_is_refused_without_printing_its_password(
    config_file, invoke, url
):
    """urllib sends no credentials from a URL; every message about it would show them."""
    said = _usage_error(invoke("stats", "--config", config_file, "--metrics-url", url, expect=None))
    assert "credentialsinitarenotused" in said
    assert "s3cretPW" not in said


@pytest.mark.parametrize("age", ["nan", "inf", "-inf", "1e999d"])
def test_an_age_that_is_no_finite_number_is_a_usage_error(config_file, disk_dir, invoke, age):
    populate(config_file, "org/model-a", "default", 2)
    before = sorted(os.listdir(disk_dir))
    for command in ("ls", "purge"):
        said = _usage_error(
            invoke(command, "--config", config_file, "--older-than", age, expect=None)
        )
        assert "mustbeafinitenumber" in said
    assert sorted(os.listdir(disk_dir)) == before  # nothing deleted, no purge record written


@pytest.mark.parametrize("older_than", [math.nan, math.inf, -1.0])
def test_a_purge_record_no_engine_would_read_is_refused_before_it_is_written(older_than):
    """Readers reject a record whose older_than is not a finite number >= 0: the
    purge command refuses such a selection (to_line raises) before deleting."""
    with pytest.raises(ValueError, match="older_than"):
        PurgeMarker.new(Selector(older_than=older_than)).to_line()
    assert PurgeMarker.new(Selector(older_than=0.0)).to_line()


def test_config_doc_check_of_a_file_that_is_not_utf8_is_a_usage_error(tmp_path, invoke):
    path = tmp_path / "bin.md"
    path.write_bytes(b"\xff\xfe\x00 not utf-8\n")
    said = _usage_error(invoke("config-doc", "--check", "--path", path, expect=None))
    assert "cannotread" in said


# -- a stored header whose time is no number ------------------------------------


def _with_created(path, created) -> None:
    """Rewrite the entry file at ``path`` with ``created`` in its header, checksums right."""
    raw = path.read_bytes()
    header_len, payload_len, payload_sum, _ = codec.read_prefix(raw)
    start = codec.PREFIX_SIZE + header_len
    header = json.loads(raw[codec.PREFIX_SIZE : start])
    text = json.dumps({**header, "created": created}).encode()
    text += b" " * (-len(text) % codec.ALIGN)
    prefix = codec.PREFIX.pack(
        codec.MAGIC, len(text), 0, payload_len, payload_sum, xxhash.xxh3_64_intdigest(text)
    )
    path.write_bytes(prefix + b"\0" * (codec.PREFIX_SIZE - len(prefix)) + text + raw[start:])


def test_an_entry_whose_created_is_no_number_is_listed_as_unreadable(
    config_file, disk_dir, invoke, invoke_json, wide
):
    populate(config_file, "org/model-a", "default", 2)
    victim = sorted(disk_dir.glob("*.pt"))[0]
    _with_created(victim, "yesterday")
    rows = invoke_json("ls", "--config", config_file)
    assert [r["error"] for r in rows if r["error"]] == ["bad created 'yesterday'"]
    assert all(r["age_seconds"] is not None for r in rows)  # aged by its file
    assert "bad created" in invoke("ls", "--config", config_file).stdout
    invoke("purge", "--config", config_file, "--older-than", "0s")
    assert not list(disk_dir.glob("*.pt"))


@pytest.mark.parametrize("created", ["yesterday", math.nan, math.inf, None, True])
def test_an_entry_whose_created_is_no_finite_number_is_aged_by_its_file(created):
    entry = Entry("remote", "name", 1, mtime=100.0, header={"created": created})
    assert entry.created == 100.0 and entry.age(160.0) == 60.0
    assert Entry("disk", "name", 1, mtime=100.0, header={"created": 40}).created == 40.0
