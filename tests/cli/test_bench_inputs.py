"""What a user can hand ``bench`` that it must refuse before any job starts.

- a --redis-url that names no single Redis server, a --directory that does not
  exist, a --startup-cpu-gb that is no number > 0 (upstream's engine never
  starts with one) and --threads 0 exit 2 with a message, never a traceback
  nor a hang;
- a Redis that does not answer exits 1 with a message naming it, and so does a
  job that fails (a server refusing the commands): its error, not a traceback.
"""

from __future__ import annotations

import pytest

from tests.servers import free_port


def _error(result, code: int) -> str:
    """Exit ``code`` through the command's own error path; the output, whitespace undone."""
    assert result.exit_code == code, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return "".join(result.output.split())


@pytest.mark.parametrize("command", [("bench", "remote"), ("bench",)], ids=["remote", "all"])
@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://x", "mustnameoneRedisserver"),
        ("redis-cluster://a:1,b:2", "mustnameoneRedisserver"),
        ("redis://h:abc", "Portcouldnotbecast"),
    ],
)
def test_a_redis_url_that_names_no_redis_server_is_a_usage_error(invoke, command, url, said):
    shown = _error(invoke(*command, "--redis-url", url, expect=None), 2)
    assert f"invalid--redis-url'{url}'" in shown and said in shown


def test_a_redis_that_does_not_answer_is_an_error_naming_it(invoke):
    url = f"redis://:hunter2@127.0.0.1:{free_port()}"
    said = _error(invoke("bench", "remote", "--redis-url", url, expect=None), 1)
    assert f"127.0.0.1:{url.rsplit(':', 1)[1]}unreachable" in said and "hunter2" not in said


@pytest.mark.parametrize("command", [("bench", "local"), ("bench",)], ids=["local", "all"])
def test_a_directory_that_does_not_exist_is_a_usage_error(tmp_path, invoke, command):
    missing = tmp_path / "nowhere"
    said = _error(invoke(*command, "--no-startup", "--directory", missing, expect=None), 2)
    assert f"--directory'{missing}'isnotanexistingdirectory" in said


@pytest.mark.parametrize("command", [("bench", "local"), ("bench",)], ids=["local", "all"])
@pytest.mark.parametrize("size", ["-1", "0", "nan", "inf"])
@pytest.mark.timeout(60)  # upstream's engine with no positive size never returns
def test_a_startup_cpu_tier_of_no_positive_size_is_a_usage_error(invoke, command, size):
    said = _error(invoke(*command, "--startup-cpu-gb", size, expect=None), 2)
    assert "--startup-cpu-gbmustbeanumber>0" in said


def test_zero_threads_is_a_usage_error(invoke):
    result = invoke("bench", "local", "--no-startup", "--threads", "0", expect=2)
    assert "--threads" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_a_job_that_fails_is_an_error_not_a_traceback(redis_process, invoke):
    """A user who may PING but not read or write: the probe passes, the job fails."""
    redis_process.client().acl_setuser(
        "pinger", enabled=True, passwords=["+pw"], keys="*", commands=["+ping", "+hello"]
    )
    url = f"redis://pinger:pw@127.0.0.1:{redis_process.port}"
    result = invoke("bench", "remote", "--redis-url", url, "--iterations", "1", expect=None)
    said = _error(result, 1)
    assert "benchremotefailed" in said and "nopermissions" in said
