#!/usr/bin/env bash
# The GPU check (gpu/check.py, not part of the test suite) on a machine with an NVIDIA
# GPU, Python 3.12 and a CUDA build of PyTorch, without network: installs the wheels
# gpu/fetch-wheels.sh put in .whl/ into /tmp/site (beside the machine's own packages),
# then runs the check on this checkout. Exit status: see gpu/check.py.
#
#   bash gpu/check.sh                  on the GPU machine, from a copy carrying .whl/
#   bash gpu/check.sh --cpu-dry-run    the same steps on the CPU, to try the script
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
case " $* " in
    *" --cpu-dry-run "* | *" --imports-only "*) ;;
    *)  # before anything is installed: say so at once on a machine without a GPU
        "$PYTHON" -c 'import sys
try:
    import torch
except ImportError:
    sys.exit(print(f"gpu/check: no PyTorch for {sys.executable}", file=sys.stderr) or 2)
if not torch.cuda.is_available():
    print("gpu/check: no CUDA device: torch.cuda.is_available() is False (torch "
          f"{torch.__version__}, CUDA {torch.version.cuda}). Run this on a machine "
          "with an NVIDIA GPU and its driver.", file=sys.stderr)
    sys.exit(2)' || exit ;;
esac
if compgen -G ".whl/*.whl" >/dev/null; then
    if "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "gpu/check: .whl/ holds wheels for Python 3.12; using this Python's packages" >&2
    fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export LMCACHE_LOG_LEVEL=${LMCACHE_LOG_LEVEL:-WARNING}
exec "$PYTHON" gpu/check.py "$@"
