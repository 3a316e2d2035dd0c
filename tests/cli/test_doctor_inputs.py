"""doctor given what it cannot use, or must not say twice: a row that says so, no traceback.

- a disk directory this user can write into but not list (mode 0300, checked
  without CAP_DAC_OVERRIDE, as any non-root user runs): a ``disk tier`` fail
  row naming the directory and the reason (so exit 1), not a traceback;
- a dependency that several extras name (matplotlib: ``[demo]`` and
  ``[bench]``) is one row of the version check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from .conftest import write_config

_CHECK_DISK = textwrap.dedent(
    """
    import json, sys
    from lmcache_ec.cli.doctor import check_disk
    from lmcache_ec.config import load_config
    print(json.dumps([vars(c) for c in check_disk(load_config(sys.argv[1]))]))
    """
)


def _without_dac_override() -> list[str]:
    """The command prefix that runs a child as this user without the capabilities
    that ignore file modes (root's CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: modes cannot be made to apply")
    return ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]


def test_doctor_reports_a_disk_directory_it_can_write_but_not_list(tmp_path):
    store = tmp_path / "disk"
    store.mkdir(mode=0o700)
    os.chmod(store, 0o300)  # write and search, no read: created entries are never found
    config = write_config(tmp_path / "c.yaml", local_disk=str(store))
    try:
        child = subprocess.run(
            [*_without_dac_override(), sys.executable, "-c", _CHECK_DISK, config],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.chmod(store, 0o700)
    assert child.returncode == 0, child.stderr
    (row,) = json.loads(child.stdout)
    assert row["area"] == "disk tier" and row["status"] == "fail", row
    assert f"{store} is writable but cannot be listed" in row["message"]
    assert "Permission denied" in row["message"]


def test_doctor_lists_a_dependency_several_extras_name_once():
    from lmcache_ec.cli.doctor import check_versions

    areas = [check.area for check in check_versions()]
    assert areas.count("matplotlib") == 1, areas
    assert len(areas) == len(set(areas)), areas
