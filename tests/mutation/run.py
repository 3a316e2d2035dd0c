"""Run the mutation check: each mutation in a copy of the repository, its named tests only.

    python -m tests.mutation                 every mutation (baseline run first)
    python -m tests.mutation --list          the mutations and their tests
    python -m tests.mutation --only NAME...  some of them
    python -m tests.mutation --area AREA...  those of some areas (--areas lists them)
    python -m tests.mutation --keep          keep the copy (path printed)
    python -m tests.mutation --every-test    run every named test, not only up to
                                             the first that catches the mutation

The working tree is never written: it is copied once to a temporary directory
(without .git and caches), and each mutation is applied to that copy, its
tests run there (cwd and PYTHONPATH the copy, no bytecode written, pytest's
cache off, its own basetemp), then the file is restored. A pytest plugin
(``plugin.py``) reports which tests failed and which ``lmcache_ec`` was
imported; a run that imported anything but the copy stops the check.

Before the list: a canary (a copy that cannot import ``lmcache_ec.key``) must
fail, and a baseline run of every named test on the unmutated copy must pass,
or no result below means anything.

Exit status 0 only if every mutation was caught by at least one of its named
tests and every snippet was found exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.mutation.mutations import CANARY, MUTATIONS, Mutation

ROOT = Path(__file__).resolve().parents[2]
IGNORED = shutil.ignore_patterns(
    ".git", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info", ".venv*", "*.pyc"
)
RUN_TIMEOUT = 1800  # seconds for one pytest run (pytest-timeout bounds each test at 300)


@dataclass
class Outcome:
    mutation: Mutation
    status: str  # CAUGHT, SURVIVED, SNIPPET NOT FOUND, SNIPPET NOT UNIQUE, ERROR
    caught_by: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)  # named tests that did not fail
    seconds: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "CAUGHT"


class Copy:
    """A copy of the working tree that tests can be run in."""

    def __init__(self, keep: bool, every_test: bool = False) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="ec-mutation-"))
        self.repo = self.base / "repo"
        self.keep = keep
        self.every_test = every_test
        shutil.copytree(ROOT, self.repo, ignore=IGNORED, symlinks=True)
        self.runs = 0

    def close(self) -> None:
        if self.keep:
            print(f"copy kept at {self.repo}")
        else:
            shutil.rmtree(self.base, ignore_errors=True)

    def occurrences(self, mutation: Mutation) -> int:
        path = self.repo / mutation.path
        if not path.is_file():
            return 0
        return path.read_text().count(mutation.find)

    def pytest(self, tests: list[str], label: str, stop_at_first_failure: bool = False) -> dict:
        """Run ``tests`` in the copy; the plugin's report plus ``output`` and ``returncode``.

        ``stop_at_first_failure``: one failing named test is enough to catch a
        mutation, so the rest need not run (most mutations end in seconds).
        """
        self.runs += 1
        report_path = self.base / f"report-{self.runs}.json"
        log_path = self.base / f"{self.runs:02d}-{label}.log"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(
            PYTHONPATH=str(self.repo),
            PYTHONDONTWRITEBYTECODE="1",
            EC_MUTATION_REPORT=str(report_path),
            LMCACHE_LOG_LEVEL="WARNING",
        )
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.mutation.plugin",
            "-q",
            "-o",
            "addopts=",
            f"--rootdir={self.repo}",
            f"--basetemp={self.base / 'basetemp'}",
            *(["--exitfirst"] if stop_at_first_failure and not self.every_test else []),
            *tests,
        ]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                command,
                cwd=self.repo,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its servers and workers go with it
            )
            try:
                returncode = proc.wait(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                returncode = -1
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        report["returncode"] = returncode
        report["log"] = str(log_path)
        return report

    def check_imported(self, report: dict) -> None:
        imported = report.get("lmcache_ec", "")
        if not imported.startswith(str(self.repo.resolve()) + os.sep):
            raise SystemExit(
                f"the test run imported lmcache_ec from {imported or '(nothing)'}, not from "
                f"the copy {self.repo}: results would describe the working tree. Log: "
                f"{report.get('log')}"
            )


def _problem(report: dict, tests: list[str]) -> str:
    """Why a run says nothing about its tests (not all collected, pytest error), or ''."""
    if not report.get("collected") and report.get("returncode") != 1:
        return f"pytest exit {report.get('returncode')}, see {report.get('log')}"
    missing = [t for t in tests if t not in report.get("collected", [])]
    if missing:
        return f"tests not collected: {', '.join(missing)} (see {report.get('log')})"
    if report.get("returncode") not in (0, 1):
        return f"pytest exit {report.get('returncode')}, see {report.get('log')}"
    return ""


def run_mutation(copy: Copy, mutation: Mutation) -> Outcome:
    started = time.monotonic()
    found = copy.occurrences(mutation)
    if found == 0:
        return Outcome(
            mutation, "SNIPPET NOT FOUND", detail=f"{mutation.find!r} in {mutation.path}"
        )
    if found > 1:
        return Outcome(mutation, "SNIPPET NOT UNIQUE", detail=f"{found}x in {mutation.path}")
    path = copy.repo / mutation.path
    original = path.read_text()
    path.write_text(original.replace(mutation.find, mutation.replace, 1))
    try:
        tests = list(mutation.tests)
        report = copy.pytest(tests, mutation.name, stop_at_first_failure=mutation is not CANARY)
    finally:
        path.write_text(original)
    seconds = time.monotonic() - started
    if mutation is CANARY:
        # The copy cannot import lmcache_ec.key: collecting the test fails, or it does.
        if report["returncode"] in (0, -1):
            return Outcome(mutation, "SURVIVED", seconds=seconds, detail=report["log"])
        return Outcome(mutation, "CAUGHT", tests, [], seconds)
    copy.check_imported(report)
    problem = _problem(report, tests)
    if problem:
        return Outcome(mutation, "ERROR", seconds=seconds, detail=problem)
    failed = set(report.get("failed", []))
    caught = [t for t in tests if t in failed]
    ran = set(report.get("ran", []))
    passed = [t for t in tests if t in ran and t not in failed]
    status = "CAUGHT" if caught else "SURVIVED"
    return Outcome(mutation, status, caught, passed, seconds, "" if caught else report["log"])


def baseline(copy: Copy, mutations: list[Mutation]) -> tuple[bool, float]:
    tests = sorted({t for m in mutations for t in m.tests})
    started = time.monotonic()
    report = copy.pytest(tests, "baseline")
    seconds = time.monotonic() - started
    copy.check_imported(report)
    problem = _problem(report, tests)
    failed = report.get("failed", [])
    if problem or failed:
        print(f"BASELINE FAILS ({seconds:.0f} s): the named tests must pass on the unmutated copy")
        for test in failed:
            print(f"  failed: {test}")
        if problem:
            print(f"  {problem}")
        return False, seconds
    print(f"baseline: {len(tests)} named tests pass on the unmutated copy ({seconds:.0f} s)")
    return True, seconds


def _short(test: str) -> str:
    return test.removeprefix("tests/")


def print_table(outcomes: list[Outcome]) -> None:
    print()
    print("| mutation | guarantee | caught by | time |")
    print("|---|---|---|---|")
    for o in outcomes:
        if o.ok:
            result = "<br>".join(_short(t) for t in o.caught_by)
        else:
            result = f"**{o.status}** {o.detail}".strip()
        print(f"| {o.mutation.name} | {o.mutation.guarantee} | {result} | {o.seconds:.0f} s |")
    notes = [o for o in outcomes if o.ok and o.passed]
    if notes:
        print()
        print("Named tests that did not fail under their mutation (keep the list accurate):")
        for o in notes:
            for test in o.passed:
                print(f"  {o.mutation.name}: {_short(test)}")


def area_of(mutation: Mutation) -> str:
    """The package folder the mutated file lives in ("core" for top-level modules)."""
    parts = Path(mutation.path).parts
    if parts[0] != "lmcache_ec":
        return parts[0]
    folders = [p for p in parts[1:-1] if p != "integration"]
    return folders[0] if folders else "core"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--area", nargs="+", metavar="AREA", help="run those of these areas")
    parser.add_argument("--areas", action="store_true", help="print the areas and exit")
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy")
    parser.add_argument(
        "--every-test",
        action="store_true",
        help="run every named test of a mutation (default: stop at the first that catches it)",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the run of the unmutated copy"
    )
    args = parser.parse_args(argv)

    mutations = MUTATIONS
    if args.only:
        unknown = set(args.only) - {m.name for m in MUTATIONS}
        if unknown:
            parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
        mutations = [m for m in MUTATIONS if m.name in args.only]
    areas: dict[str, int] = {}
    for m in MUTATIONS:
        areas[area_of(m)] = areas.get(area_of(m), 0) + 1
    if args.areas:
        for area, count in sorted(areas.items()):
            print(f"{area}: {count} mutations")
        return 0
    if args.area:
        unknown = set(args.area) - set(areas)
        if unknown:
            parser.error(f"unknown area(s): {', '.join(sorted(unknown))} (--areas lists them)")
        mutations = [m for m in mutations if area_of(m) in args.area]
    if args.list:
        for m in mutations:
            print(f"{m.name}: {m.guarantee}\n  {m.path}: {m.find!r} -> {m.replace!r}")
            for test in m.tests:
                print(f"    {test}")
        return 0

    started = time.monotonic()
    copy = Copy(keep=args.keep, every_test=args.every_test)
    try:
        print(f"copy of {ROOT} at {copy.repo}")
        canary = run_mutation(copy, CANARY)
        if not canary.ok:
            print(f"CANARY {canary.status}: {canary.detail}; the check cannot be trusted")
            return 2
        print(f"canary: a broken copy fails its test ({canary.seconds:.0f} s)")
        if not args.no_baseline:
            passed, _ = baseline(copy, mutations)
            if not passed:
                return 2
        outcomes = []
        for mutation in mutations:
            outcome = run_mutation(copy, mutation)
            print(f"{mutation.name}: {outcome.status} ({outcome.seconds:.0f} s)", flush=True)
            outcomes.append(outcome)
        print_table(outcomes)
    finally:
        copy.close()
    failures = [o for o in outcomes if not o.ok]
    total = time.monotonic() - started
    print()
    print(
        f"{len(outcomes) - len(failures)}/{len(outcomes)} mutations caught; "
        f"wall time {total:.0f} s ({total / 60:.1f} min)"
    )
    return 1 if failures else 0
