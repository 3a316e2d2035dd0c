"""The ``lmcache-ec`` command: demo, bench, doctor, stats, ls, purge, config-doc.

Every command takes ``--config`` (an LMCache YAML file with an ``ec:``
section); without it ``$LMCACHE_CONFIG_FILE`` and then the embedded default
(CPU + disk under the user's cache directory) apply, as for ``ECCache``.
Exit status: 0 success, 1 a problem was found, 2 invalid usage or config.
"""

from __future__ import annotations

import logging
import os

# Before any subcommand module imports LMCache, which reads its level once.
_LEVEL_FROM_USER = "LMCACHE_LOG_LEVEL" in os.environ
os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")

import typer  # noqa: E402

from .bench import bench_app  # noqa: E402
from .bench_channel import channel  # noqa: E402
from .bench_checks import fingerprint, node_reads  # noqa: E402
from .bench_serve import serve  # noqa: E402
from .bench_steps import steps  # noqa: E402
from .demo import demo  # noqa: E402
from .doctor import doctor  # noqa: E402
from .entries import ls, stats  # noqa: E402
from .purge_entries import purge  # noqa: E402
from .reference import config_doc  # noqa: E402

app = typer.Typer(
    name="lmcache-ec",
    help="Encoder-output tier for LMCache: demo, benchmarks and operations.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(demo)
bench_app.command()(steps)
bench_app.command()(serve)
bench_app.command("node-reads")(node_reads)
bench_app.command()(fingerprint)
bench_app.command()(channel)
app.add_typer(bench_app, name="bench")
app.command()(doctor)
app.command()(stats)
app.command("ls")(ls)
app.command()(purge)
app.command("config-doc")(config_doc)


def _quiet_lmcache() -> None:
    """LMCache logs every store at INFO; a CLI shows its own output instead.

    ``LMCACHE_LOG_LEVEL`` still wins when set. Loggers created before ``main``
    runs (``import lmcache_ec`` loads LMCache) are adjusted too.
    """
    if _LEVEL_FROM_USER:
        return
    # LMCache's own start-up warnings (e.g. no controller) are noise here;
    # lmcache-ec's warnings (corrupt entries, failing tiers) stay visible.
    for name in list(logging.root.manager.loggerDict):
        root = name.split(".")[0]
        if root == "lmcache":
            logging.getLogger(name).setLevel(logging.ERROR)
        elif root == "lmcache_ec":
            logging.getLogger(name).setLevel(logging.WARNING)


def main() -> None:
    _quiet_lmcache()
    app()


__all__ = ["app", "main"]
