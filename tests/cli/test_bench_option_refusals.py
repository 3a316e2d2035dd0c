"""Options of ``bench`` and ``config-doc`` that cannot work are refused, never a traceback.

- an output file (--json, --markdown, --chart) in no directory, or that is a
  directory, exits 2 when the command line is parsed: before any benchmark runs,
  so a long run is never wasted on a file it cannot write;
- a file the filesystem refuses to write (``config-doc --write``) exits 2 with
  one line naming it;
- a time, an exponent or a bandwidth that is no finite number (nan, inf, a
  word), is negative, or is 0 where it divides, exits 2 when parsed;
- a steep Zipf exponent (``bench fleet --zipf 2000``) draws the most popular
  image, where its weights used to overflow.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmcache_ec.bench.fleet import FleetSettings, image_stream
from lmcache_ec.cli.reference import BEGIN, END

# Small work wherever a command has options for it: a mistake is then quick to see.
FINGERPRINT = ("bench", "fingerprint", "--tensors", "1", "--elements", "1024", "--repeat", "1")

OUTPUTS = [
    (("bench",), "--json"),
    (("bench",), "--markdown"),
    (("bench",), "--chart"),
    (("bench", "local"), "--json"),
    (("bench", "remote"), "--json"),
    (("bench", "connector"), "--json"),
    (("bench", "fleet"), "--json"),
    (("bench", "node-reads"), "--json"),
    (FINGERPRINT, "--json"),
    (("bench", "steps"), "--json"),
    (("bench", "channel"), "--json"),
    (("bench", "serve"), "--json"),
    (("bench", "serve"), "--markdown"),
    (("bench", "serve"), "--chart"),
]


def _refused(result) -> str:
    """Exit 2 as a usage error; the output with the error box's borders and whitespace undone."""
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return "".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize(
    ("command", "option"), OUTPUTS, ids=[f"{'-'.join(c[1:2] or ['all'])}{o}" for c, o in OUTPUTS]
)
def test_an_output_file_in_no_directory_is_refused_before_the_benchmark_runs(
    tmp_path, monkeypatch, invoke, command, option
):
    monkeypatch.chdir(tmp_path)
    said = _refused(invoke(*command, option, "nowhere/out.json", expect=None))
    assert f"Invalidvaluefor'{option}':cannotwrite'nowhere/out.json':nodirectorynowhere" in said


@pytest.mark.parametrize(
    ("target", "reason"),
    [("a-dir", "itisadirectory"), ("a-file/out.json", "nodirectorya-file")],
    ids=["a-directory", "under-a-file"],
)
def test_an_output_file_that_is_a_directory_or_under_a_file_is_refused(
    tmp_path, monkeypatch, invoke, target, reason
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("kept")
    said = _refused(invoke(*FINGERPRINT, "--json", target, expect=None))
    assert f"cannotwrite'{target}':{reason}" in said
    assert (tmp_path / "a-file").read_text() == "kept"


@pytest.mark.parametrize("command", [("bench",), ("bench", "serve")], ids=["bench", "serve"])
def test_a_chart_of_a_format_matplotlib_does_not_write_is_refused_before_the_run(
    tmp_path, monkeypatch, invoke, command
):
    """matplotlib picks the format from the suffix and raises on one it does not
    know: after the whole benchmark ran."""
    monkeypatch.chdir(tmp_path)
    said = _refused(invoke(*command, "--chart", "out.foo", expect=None))
    assert "Invalidvaluefor'--chart':achartis.png,.svg,.pdf,not'out.foo'" in said


def test_an_output_file_that_can_be_written_is_written(tmp_path, invoke):
    out = tmp_path / "fingerprint.json"
    shown = "".join(invoke(*FINGERPRINT, "--json", out).stdout.split())
    assert f"wrote{out}" in shown
    assert '"tensors": 1' in out.read_text()


@pytest.fixture
def unwritable_doc():
    """A readable file with the config table's markers that no write succeeds on: the
    command line of a process waiting on its stdin, in /proc."""
    waiter = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", BEGIN, END],
        stdin=subprocess.PIPE,
    )
    path = Path(f"/proc/{waiter.pid}/cmdline")
    try:
        deadline = time.monotonic() + 10
        while END not in path.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)  # its command line is the fork's until it execs
        yield path
    finally:
        waiter.kill()
        waiter.wait()


def test_config_doc_write_to_a_file_that_refuses_writes_is_one_error_line(unwritable_doc, invoke):
    result = invoke("config-doc", "--write", "--path", unwritable_doc, expect=None)
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.output.strip().splitlines() == [
        f"error: cannot write {unwritable_doc}: Invalid argument"
    ]


NON_NEGATIVE = [
    (("bench", "fleet"), "--zipf"),
    (("bench", "fleet"), "--interval-ms"),
    (("bench", "fleet"), "--encode-ms"),
    (("bench", "fleet"), "--forward-ms"),
    (("bench", "fleet"), "--claim-wait-s"),
    (("bench", "steps"), "--delay-ms"),
    (("bench", "steps"), "--forward-ms"),
    (("bench", "steps"), "--encode-ms"),
    (("bench", "channel"), "--pause-s"),
    (("bench", "channel"), "--forward-ms"),
    (("bench", "channel"), "--busy-stage-wait-s"),
    (("bench", "serve"), "--settle-s"),
]
POSITIVE = [
    (FINGERPRINT, "--gpu-bandwidth-gbs"),
    (FINGERPRINT, "--link-gbs"),
    (("bench", "local"), "--cpu-gb"),
]
NOT_FINITE = [("nan", "mustbeafinitenumber"), ("inf", "mustbeafinitenumber")]
NOT_NUMBERS = [("fast", "mustbeanumber"), *NOT_FINITE, ("-1", "mustbe>=0")]


@pytest.mark.parametrize(("value", "reason"), NOT_NUMBERS, ids=[v for v, _ in NOT_NUMBERS])
@pytest.mark.parametrize(
    ("command", "option"), NON_NEGATIVE, ids=[f"{c[1]}{o}" for c, o in NON_NEGATIVE]
)
def test_a_time_or_exponent_that_is_no_finite_number_at_least_0_is_refused_when_parsed(
    invoke, command, option, value, reason
):
    said = _refused(invoke(*command, option, value, expect=None))
    assert f"Invalidvaluefor'{option}':{reason},not'{value}'" in said


@pytest.mark.parametrize(
    ("value", "reason"),
    [("0", "mustbe>0"), ("-1", "mustbe>0"), *NOT_FINITE],
    ids=["0", "-1", "nan", "inf"],
)
@pytest.mark.parametrize(("command", "option"), POSITIVE, ids=[o for _, o in POSITIVE])
def test_a_bandwidth_or_size_that_is_no_finite_number_above_0_is_refused_when_parsed(
    invoke, command, option, value, reason
):
    said = _refused(invoke(*command, option, value, expect=None))
    assert f"Invalidvaluefor'{option}':{reason},not'{value}'" in said


def test_a_steep_zipf_draws_the_most_popular_image_instead_of_overflowing():
    stream = image_stream(FleetSettings(requests=50, images=100, zipf=2000.0))
    assert len(stream) == 50 and len(set(stream)) == 1
    assert stream[0] == image_stream(FleetSettings(requests=1, images=1, zipf=2000.0))[0]
