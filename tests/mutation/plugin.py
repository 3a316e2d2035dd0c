"""pytest plugin loaded by the mutation runner (``-p tests.mutation.plugin``).

Writes, to the JSON file named by ``EC_MUTATION_REPORT``: the node ids that
failed or errored, the node ids collected, those that ran, and which ``lmcache_ec`` was
imported (the runner checks it is the mutated copy, not the installed tree).
"""

from __future__ import annotations

import json
import os

import pytest

_FAILED = pytest.StashKey[set]()
_COLLECTED = pytest.StashKey[list]()
_RAN = pytest.StashKey[set]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_FAILED] = set()
    config.stash[_COLLECTED] = []
    config.stash[_RAN] = set()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[_COLLECTED].extend(item.nodeid for item in items)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _config.stash[_FAILED].add(report.nodeid)
    if report.when == "call" or report.failed:
        _config.stash[_RAN].add(report.nodeid)


_config: pytest.Config


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _config
    _config = session.config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("EC_MUTATION_REPORT")
    if not path:
        return
    import lmcache_ec

    report = {
        "lmcache_ec": os.path.realpath(lmcache_ec.__file__),
        "failed": sorted(session.config.stash[_FAILED]),
        "collected": session.config.stash[_COLLECTED],
        "ran": sorted(session.config.stash[_RAN]),
        "exitstatus": int(exitstatus),
    }
    with open(path, "w") as stream:
        json.dump(report, stream)
