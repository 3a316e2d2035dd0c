"""`./run` shares, builds, checks and removes its virtualenvs safely, and runs every part asked.

Clones with the same pyproject.toml share a venv, and each imports its own code; two
`./run` at once build a venv once and never delete one under the other; a directory
that LMCACHE_EC_VENV names is never deleted unless ./run made it, and a venv is rebuilt
when its dependencies change or its python is gone; re-pointing works offline and from a
path with a space; option values never stop the vLLM 0.33 part; a build removes the
stale venvs no run uses; two runs install redis-server once.

`./run` runs here as it is, on a copy of this clone, with a stand-in interpreter
(PYTHON): its venvs are real but empty (`venv --without-pip`), their pip records what it
is asked and installs an editable lmcache_ec the way pip and setuptools do
(direct_url.json, a finder appended to sys.meta_path), and `python -m pytest` records its
arguments. Nothing is downloaded or built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WAIT = 20.0  # seconds: bound on polls for another ./run to reach a step

# The venv's pip: a real interpreter runs it, so that it sees the venv's site-packages.
PIP = '''\
import json, os, shutil, sys, sysconfig, time, uuid
from pathlib import Path

FINDER = """\\
import importlib.util, sys
PACKAGE = {package!r}
class _Finder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != "lmcache_ec":
            return None
        return importlib.util.spec_from_file_location(
            fullname, PACKAGE + "/__init__.py", submodule_search_locations=[PACKAGE])
def install():
    sys.meta_path.append(_Finder)
"""


def install_editable(root):
    site = Path(sysconfig.get_paths()["purelib"])
    dist = site / "lmcache_ec-0.1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\\nName: lmcache-ec\\nVersion: 0.1.0\\n")
    url = Path(os.path.abspath(root)).as_uri()  # percent-encoded, as pip writes it
    (dist / "direct_url.json").write_text(json.dumps({"url": url, "dir_info": {"editable": True}}))
    finder = FINDER.format(package=os.path.abspath(root) + "/lmcache_ec")
    (site / "__editable___lmcache_ec_finder.py").write_text(finder)
    shutil.rmtree(site / "__pycache__", ignore_errors=True)  # the same size: a stale .pyc
    (site / "__editable__.lmcache_ec-0.1.0.pth").write_text(
        "import __editable___lmcache_ec_finder; __editable___lmcache_ec_finder.install()\\n")


args = sys.argv[1:]
log = Path(sys.prefix) / "pip.log"
token = uuid.uuid4().hex
with log.open("a") as out:
    out.write(f"{token} {' '.join(args)}\\n")
time.sleep(float(os.environ.get("FAKE_PIP_SECONDS", "0")))
if not log.exists() or token not in log.read_text():
    sys.exit("pip: its venv was removed while it ran")
if "-e" in args:
    if os.environ.get("FAKE_OFFLINE") and "--no-build-isolation" not in args:
        sys.exit("pip: no network to fetch setuptools>=77 for the isolated build")
    install_editable(args[args.index("-e") + 1].split("[")[0])
'''

# The venv's python: the real one, but the build's checks of vLLM (a script on stdin)
# pass and pytest records its arguments and PYTHONPATH.
VENV_PYTHON = """#!/bin/bash
here=$(dirname "$0")
if [ "$1" = - ]; then cat >/dev/null; exit 0; fi
if [ "$1 $2" = "-m pytest" ]; then
    shift 2; echo "$PYTHONPATH | $*" >>"$here/../pytest.log"; exit 0
fi
exec "$here/python3" "$@"
"""

# PYTHON for ./run: `-m venv DIR` makes a real venv without pip, with the stand-ins.
INTERPRETER = """#!/bin/bash
set -e
[ "$1 $2" = "-m venv" ] || {{ echo "stand-in python: $*" >&2; exit 99; }}
{real} -m venv --without-pip "$3"
rm "$3/bin/python"
cp {stubs}/python "$3/bin/python"
printf '#!/bin/bash\\nexec "$(dirname "$0")/python3" {stubs}/pip.py "$@"\\n' >"$3/bin/pip"
chmod +x "$3/bin/python" "$3/bin/pip"
"""


class Runs:
    """Clones of this repository's `run` and pyproject.toml sharing one cache, and ./run in them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cache = base / "cache"
        self.bin = base / "bin"
        stubs = base / "stubs"
        for folder in (self.cache, self.bin, stubs):
            folder.mkdir()
        (stubs / "pip.py").write_text(PIP)
        _executable(stubs / "python", VENV_PYTHON)
        self.interpreter = _executable(
            stubs / "interpreter", INTERPRETER.format(real=sys.executable, stubs=stubs)
        )
        _executable(self.bin / "redis-server", "#!/bin/sh\n")
        self.path = f"{self.bin}:{os.environ['PATH']}"
        self.started: list[subprocess.Popen[str]] = []

    def clone(self, name: str, pyproject_extra: str = "") -> Path:
        """A clone: `run`, pyproject.toml (plus ``pyproject_extra``) and an lmcache_ec
        whose CLONE is ``name``."""
        clone = self.base / name
        (clone / "lmcache_ec").mkdir(parents=True)
        shutil.copy2(ROOT / "run", clone / "run")
        (clone / "pyproject.toml").write_text(
            (ROOT / "pyproject.toml").read_text() + pyproject_extra
        )
        (clone / "lmcache_ec" / "__init__.py").write_text(f"CLONE = {name.split('/')[-1]!r}\n")
        return clone

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "LMCACHE_EC_"))
        }
        env.update(XDG_CACHE_HOME=str(self.cache), PYTHON=str(self.interpreter), PATH=self.path)
        env.update(extra)
        return env

    def start(self, clone: Path, *args: str, **env: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [str(clone / "run"), *args],
            cwd=clone,
            env=self.env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return process

    def run(self, clone: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(clone / "run"), *args],
            cwd=clone,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def venvs(self, pattern: str = "venv-*") -> list[Path]:
        return sorted(p for p in (self.cache / "lmcache-ec").glob(pattern) if p.is_dir())

    def serving_venv(self) -> Path:
        (venv,) = [v for v in self.venvs() if not v.name.startswith("venv-vllm")]
        return venv


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def _wait_for(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {WAIT} s"
        time.sleep(0.02)


def _re_points(venv: Path) -> list[str]:
    """The re-pointing installs in the venv's pip log (the build's own has no --no-deps)."""
    lines = (venv / "pip.log").read_text().splitlines()
    return [line for line in lines if "--no-deps" in line and " -e " in line]


def _builds(*stderrs: str) -> int:
    return sum(err.count("building virtualenv") for err in stderrs)


IMPORTS = 'cd / && python -c "import lmcache_ec; print(lmcache_ec.CLONE)"'


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    runs = Runs(tmp_path)
    yield runs
    for process in runs.started:  # those a failed test left waiting
        if process.poll() is None:
            process.kill()
            process.wait()


def _held(runs: Runs, clone: Path, then: str = "true") -> tuple[subprocess.Popen[str], Path]:
    """A ./run in ``clone`` that waits for its release file, then runs ``then``."""
    flag = clone / "started"
    command = f"touch started; while [ ! -e release ]; do sleep 0.02; done; {then}"
    process = runs.start(clone, "bash", "-c", command)
    _wait_for(flag.exists, f"start of ./run in {clone.name}")
    return process, clone / "release"


def test_what_each_run_starts_imports_its_own_clone_while_clones_share_the_venv(runs):
    a, b = runs.clone("a"), runs.clone("b")
    assert runs.run(a, "python", "-c", "pass").returncode == 0
    holder, release = _held(runs, a, then=IMPORTS)

    second = runs.run(b, "bash", "-c", IMPORTS)
    release.touch()
    rc, out, err = _finish(holder)

    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "b", "a child of B's ./run imported another clone"
    assert (rc, out.strip()) == (0, "a"), err
    assert _re_points(runs.serving_venv()) == [], "B reinstalled the package under A's run"


def test_the_suite_runs_with_its_own_clone_first_on_pythonpath(runs):
    clone = runs.clone("a")
    assert runs.run(clone, "test", "-q", "tests/test_key.py").returncode == 0
    (call,) = (runs.serving_venv() / "pytest.log").read_text().splitlines()
    assert call.split(" | ")[0] == str(clone)


def test_two_runs_at_once_build_the_venv_once_and_neither_deletes_it_under_the_other(runs):
    clone = runs.clone("a")
    first = runs.start(clone, "python", "-c", "pass", FAKE_PIP_SECONDS="0.2")
    _wait_for(lambda: list((runs.cache / "lmcache-ec").glob("venv-*/pip.log")), "build started")
    second = runs.start(clone, "python", "-c", "pass", FAKE_PIP_SECONDS="0.2")

    (rc1, _, err1), (rc2, _, err2) = _finish(first), _finish(second)

    assert (rc1, rc2) == (0, 0), err1 + err2
    assert _builds(err1, err2) == 1, err1 + err2
    assert (runs.serving_venv() / ".complete").exists()


def test_a_directory_lmcache_ec_venv_names_that_run_did_not_make_is_never_deleted(runs):
    clone = runs.clone("a")
    own = runs.base / "own-venv"
    (own / "notes").mkdir(parents=True)
    (own / "notes" / "todo.txt").write_text("precious")

    result = runs.run(clone, "python", "-c", "pass", LMCACHE_EC_VENV=str(own))

    assert result.returncode == 1
    assert "not a virtualenv ./run made" in result.stderr
    assert (own / "notes" / "todo.txt").read_text() == "precious"
    assert sorted(p.name for p in own.iterdir()) == ["notes"]


def test_a_venv_lmcache_ec_venv_names_is_rebuilt_when_the_dependencies_change(runs):
    clone = runs.clone("a")
    own = str(runs.base / "own-venv")
    assert _builds(runs.run(clone, "python", "-c", "pass", LMCACHE_EC_VENV=own).stderr) == 1
    assert _builds(runs.run(clone, "python", "-c", "pass", LMCACHE_EC_VENV=own).stderr) == 0
    pyproject = clone / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"packaging>=23",', '"packaging>=24",'))

    again = runs.run(clone, "python", "-c", "pass", LMCACHE_EC_VENV=own)

    assert again.returncode == 0, again.stderr
    assert "built for other dependencies" in again.stderr
    assert _builds(again.stderr) == 1


def test_a_venv_built_before_markers_held_the_key_is_used_as_it_is(runs):
    clone = runs.clone("a")
    assert runs.run(clone, "python", "-c", "pass").returncode == 0
    venv = runs.serving_venv()
    (venv / ".complete").write_text("")  # what earlier ./run wrote

    default = runs.run(clone, "python", "-c", "pass")
    # The same venv named in LMCACHE_EC_VENV from a run with another cache.
    named = runs.run(
        clone,
        "python",
        "-c",
        "pass",
        LMCACHE_EC_VENV=str(venv),
        XDG_CACHE_HOME=str(runs.base / "other-cache"),
    )

    assert (default.returncode, named.returncode) == (0, 0), default.stderr + named.stderr
    assert _builds(default.stderr, named.stderr) == 0


def test_a_second_clone_points_the_shared_venv_at_itself_offline(runs):
    a, b = runs.clone("a"), runs.clone("b")
    assert runs.run(a, "python", "-c", "pass").returncode == 0

    result = runs.run(
        b, "python", "-I", "-c", "import lmcache_ec; print(lmcache_ec.CLONE)", FAKE_OFFLINE="1"
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "b"
    assert len(_re_points(runs.serving_venv())) == 1


def test_a_clone_whose_path_has_a_space_is_pointed_at_once_not_on_every_run(runs):
    a, spaced = runs.clone("a"), runs.clone("with space/b")
    assert runs.run(a, "python", "-c", "pass").returncode == 0

    results = [runs.run(spaced, "python", "-c", "pass") for _ in range(3)]

    assert [r.returncode for r in results] == [0, 0, 0], results[-1].stderr
    assert len(_re_points(runs.serving_venv())) == 1


def test_a_venv_whose_python_is_gone_is_rebuilt(runs):
    clone = runs.clone("a")
    assert runs.run(clone, "python", "-c", "pass").returncode == 0
    interpreter = next(p for p in (runs.serving_venv() / "bin").glob("python3.*"))
    interpreter.unlink()
    interpreter.symlink_to("/nonexistent/python-that-was-upgraded")

    result = runs.run(clone, "python", "-c", "print('ran')")

    assert result.returncode == 0, result.stderr
    assert "does not start" in result.stderr
    assert _builds(result.stderr) == 1
    assert result.stdout.strip() == "ran"


@pytest.mark.parametrize(
    "args",
    [
        ["--junitxml", "report.xml"],
        ["--html", "report.html"],  # a plugin's option
        ["--rootdir", "."],
        ["--deselect", "tests/test_key.py::test_x"],
        ["-c", "pyproject.toml"],
    ],
    ids=lambda args: args[0],
)
def test_an_option_value_that_is_a_path_does_not_skip_the_other_vllm_parts(runs, args):
    clone = runs.clone("a")
    for report in ("report.xml", "report.html"):  # a previous run's
        (clone / report).write_text("")

    result = runs.run(clone, "test", "-q", *args)

    assert result.returncode == 0, result.stderr
    serving = (runs.serving_venv() / "pytest.log").read_text().splitlines()
    harness = runs.venvs("venv-vllm*")
    assert len(serving) == 2, serving  # every file but tests/e2e, then tests/e2e
    assert len(harness) == 1, "the vLLM 0.33 part did not run"
    assert len((harness[0] / "pytest.log").read_text().splitlines()) == 1


@pytest.mark.parametrize(
    "path", ["tests", "tests/test_key.py::test_x", "./tests/cli", "{clone}/tests/test_key.py"]
)
def test_test_paths_run_in_one_pytest_in_the_serving_venv(runs, path):
    clone = runs.clone("a")
    path = path.format(clone=clone)  # an absolute path under the clone's tests, too

    result = runs.run(clone, "test", "-q", path)

    assert result.returncode == 0, result.stderr
    (call,) = (runs.serving_venv() / "pytest.log").read_text().splitlines()
    assert call.endswith(f"-q {path}")
    assert runs.venvs("venv-vllm*") == []


def test_a_build_removes_the_stale_venvs_of_its_kind_that_no_run_uses(runs):
    old, new = runs.clone("old", "\n# old\n"), runs.clone("new")
    holder, release = _held(runs, old)  # builds the old venv and goes on using it
    (old_venv,) = runs.venvs()
    unused = runs.cache / "lmcache-ec" / "venv-0123456789abcdef"
    (unused / "bin").mkdir(parents=True)
    (unused / ".complete").write_text("0123456789abcdef\n")
    a_day_ago = time.time() - 2 * 86400
    os.utime(unused / ".complete", (a_day_ago, a_day_ago))  # built long ago, not used since
    recent = runs.cache / "lmcache-ec" / "venv-fedcba9876543210"  # another clone's, in use
    (recent / "bin").mkdir(parents=True)
    (recent / ".complete").write_text("fedcba9876543210\n")
    harness = runs.cache / "lmcache-ec" / "venv-vllm0.33.0-0123456789abcdef"
    (harness / "bin").mkdir(parents=True)
    other = runs.cache / "lmcache-ec" / "store"
    other.mkdir()

    lock = Path(f"{old_venv}.use.lock")
    os.utime(lock, (a_day_ago, a_day_ago))  # old enough: only its holder's lock keeps it
    result = runs.run(new, "python", "-c", "pass")
    release.touch()
    assert _finish(holder)[0] == 0

    assert result.returncode == 0, result.stderr
    assert not unused.exists()
    assert old_venv.is_dir(), "removed a venv another ./run was using"
    assert harness.is_dir() and other.is_dir()
    assert recent.is_dir(), "removed a venv used within the day"
    # Once unused for a day, the next build removes it.
    os.utime(lock, (a_day_ago, a_day_ago))
    assert runs.run(runs.clone("newer", "\n# newer\n"), "python", "-c", "pass").returncode == 0
    assert not old_venv.exists()


@pytest.fixture
def without_redis_server(runs: Runs) -> Path:
    """Makes runs' PATH one without redis-server, apt-get one at a time that installs it
    (a second at once fails on its lock, as apt does), sudo that runs it; returns apt's log."""
    tools = runs.base / "tools"
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if not tool.name.startswith("redis-") and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    (runs.bin / "redis-server").unlink()
    state = runs.base / "apt"
    state.mkdir()
    for name in ("apt-get", "sudo"):
        (tools / name).unlink(missing_ok=True)
    _executable(
        tools / "apt-get",
        f"""#!/bin/bash
mkdir {state}/lock 2>/dev/null || {{ echo "E: Could not get lock" >&2; exit 100; }}
echo "$*" >>{state}/log
sleep 0.5
case " $* " in *" install "*) printf '#!/bin/sh\\n' >{runs.bin}/redis-server
    chmod +x {runs.bin}/redis-server;; esac
rmdir {state}/lock
""",
    )
    _executable(tools / "sudo", '#!/bin/bash\n[ "$1" = -n ] && shift\nexec "$@"\n')
    runs.path = f"{runs.bin}:{tools}"
    return state / "log"


def test_two_runs_without_redis_server_install_it_once(runs, without_redis_server):
    a, b = runs.clone("a"), runs.clone("b")
    first = runs.start(a, "test", "-q", "tests/test_key.py")
    _wait_for(without_redis_server.exists, "apt-get started")
    second = runs.start(b, "test", "-q", "tests/test_key.py")

    (rc1, _, err1), (rc2, _, err2) = _finish(first), _finish(second)

    assert (rc1, rc2) == (0, 0), err1 + err2
    installs = [line for line in without_redis_server.read_text().splitlines() if "install" in line]
    assert len(installs) == 1
