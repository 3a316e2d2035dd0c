"""Shared pieces of the CLI: the ``--config`` option, config loading, formatting."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sys
from collections.abc import Callable, Container, Iterable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..config import ConfigError, ECConfig, load_config
from ..remote_names import redact

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="LMCache YAML file with an `ec:` section "
        "(default: $LMCACHE_CONFIG_FILE, then the embedded CPU + disk default).",
        show_default=False,
    ),
]


def new_table(title: str, columns: Iterable[str], right: Container[str] = ()) -> Table:
    """A table of ``columns``; those in ``right`` (numbers) are right-justified.
    A word longer than its column is folded onto the next line, not cut: piped
    output (80 columns) keeps every path and name whole."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", overflow="fold")
    return table


def fail(message: str, code: int = 1) -> NoReturn:
    # Escaped: messages quote config values, paths and URLs ("[/db]" is no tag).
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def config_source(path: str | None) -> str | None:
    if path is not None and not os.path.exists(path):
        fail(f"config file not found: {path}", 2)
    return path


def load(path: str | None) -> ECConfig:
    """The validated config, or exit 2 with the config error."""
    try:
        return load_config(config_source(path))
    except ConfigError as exc:
        fail(f"invalid configuration: {exc}", 2)


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(seconds, 0.0)
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.1f}{unit}"
    return f"{seconds:.0f}s"


def parse_duration(text: str | None) -> float | None:
    """``90``, ``90s``, ``15m``, ``2h``, ``7d`` → seconds; exit 2 if malformed."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    raw = text.strip().lower()
    scale = units.get(raw[-1:])
    number = raw[:-1] if scale else raw
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        fail(f"invalid duration {text!r}: use e.g. 90s, 15m, 2h, 7d", 2)
    if not math.isfinite(value):  # nan selects nothing; no engine reads such a purge record
        fail(f"invalid duration {text!r}: must be a finite number", 2)
    if value < 0:
        fail(f"invalid duration {text!r}: must be >= 0", 2)
    return value


def short(text: Any, width: int = 16) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def finite_number(text: str | float) -> float:
    """A number option's value; else BadParameter, a usage error (exit 2) raised when the
    command line is parsed, before a benchmark sets anything up."""
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"must be a number, not {text!r}") from None
    if not math.isfinite(value):  # nan passes every comparison and prints nonsense
        raise typer.BadParameter(f"must be a finite number, not {text!r}")
    return value


def non_negative_float(text: str | float) -> float:
    """Parser of a float option that must be finite and >= 0 (a time, an exponent)."""
    value = finite_number(text)
    if value < 0:
        raise typer.BadParameter(f"must be >= 0, not {text!r}")
    return value


def positive_float(text: str | float) -> float:
    """Parser of a float option that must be finite and > 0 (a bandwidth, a size)."""
    value = finite_number(text)
    if value <= 0:
        raise typer.BadParameter(f"must be > 0, not {text!r}")
    return value


def unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file, or None (a full disk shows only when writing)."""
    if path.is_dir():
        return "it is a directory"
    if path.exists():
        return None if os.access(path, os.W_OK) else "it is not writable"
    parent = path.parent
    if not parent.is_dir():
        return f"no directory {parent}"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"{parent} is not writable"


def output_file(text: str) -> Path:
    """Parser of an output file option (--json, --markdown, --chart): a path that cannot be
    written is a usage error when the command line is parsed, not after a long benchmark."""
    path = Path(text)
    try:
        reason = unwritable(path)
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        reason = str(exc)
    if reason:
        raise typer.BadParameter(f"cannot write {text!r}: {reason}")
    return path


CHART_SUFFIXES = (".png", ".svg", ".pdf")


def chart_file(text: str) -> Path:
    """Parser of ``--chart``: a writable path whose suffix names a format matplotlib
    writes (else it raises after the benchmark ran)."""
    path = output_file(text)
    if path.suffix.lower() not in CHART_SUFFIXES:
        raise typer.BadParameter(f"a chart is {', '.join(CHART_SUFFIXES)}, not {text!r}")
    return path


def write_text(path: str | Path, text: str) -> None:
    """Write an output file; an error of the filesystem (read-only, full) exits 2, one line."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}", 2)
    console.print(f"wrote {escape(str(path))}")


def write_json(path: str | Path | None, data: Any) -> None:
    if path is not None:
        write_text(path, json.dumps(data, indent=2))


def write_report(
    result: dict[str, Any],
    *,
    print_table: Callable[[dict[str, Any], Console], None],
    to_markdown: Callable[[dict[str, Any]], str],
    draw_chart: Callable[[dict[str, Any], str], None],
    json_path: Path | None,
    markdown: Path | None,
    chart: Path | None,
    no_chart: bool,
    default_chart: str,
) -> None:
    """A benchmark's table on the console, then its JSON, Markdown and chart files."""
    print_table(result, console)
    write_json(json_path, result)
    if markdown is not None:
        write_text(markdown, to_markdown(result))
    if not no_chart:
        png = chart or (json_path.with_suffix(".png") if json_path else Path(default_chart))
        try:
            draw_chart(result, str(png))
            console.print(f"wrote {escape(str(png))}")
        except ImportError:
            console.print("chart skipped: matplotlib is not installed (pip install matplotlib)")
        except OSError as exc:  # the default ./bench.png in a directory that takes no file
            fail(f"cannot write {png}: {exc.strerror or exc}", 2)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_with_status(label: str, run: Callable[[Callable[[str], None], str], Any]) -> Any:
    """Run a benchmark: progress on the console, the command line (passwords
    redacted) for its report, and SIGTERM turned into KeyboardInterrupt so the
    servers and jobs it started are stopped."""
    argv = [redact(arg) if "://" in arg else arg for arg in sys.argv[1:]]
    command = shlex.join(["lmcache-ec", *argv]) if argv[:1] == ["bench"] else ""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with console.status(f"{label}: starting") as status:
            return run(lambda text: status.update(f"{label}: {text}"), command)
    finally:
        signal.signal(signal.SIGTERM, previous)


def simulated_engine_model(model_dir: Path | None) -> str:
    """The model directory a simulated engine (vLLM's real ``Scheduler``, no
    weights) is built from: ``model_dir`` or the packaged tiny BLIP-2; with
    vLLM set up for it (CPU, offline, the connector registered)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..bench.subjects import TINY_MODEL_DIR
    from ..integration.vllm.plugin import register

    directory = str(model_dir) if model_dir is not None else TINY_MODEL_DIR
    if not (Path(directory) / "config.json").exists():
        fail(f"{directory} has no config.json", 2)
    register()
    return directory


def run_and_show(
    status: str,
    run: Callable[[], dict[str, Any]],
    show: Callable[[dict[str, Any]], None],
    as_json: Path | None,
) -> None:
    """A simulated-engine benchmark: ``run`` under a status line (its
    RuntimeError is the command's error), its table, then its JSON."""
    with console.status(status):
        try:
            result = run()
        except RuntimeError as exc:
            fail(str(exc), 1)
    show(result)
    write_json(as_json, result)
