#!/usr/bin/env bash
# Downloads into .whl/ the wheels gpu/check.sh installs on a GPU machine that has no
# network: Python 3.12, x86-64 manylinux, with PyTorch and the packages of its image
# already there. They are what lmcache-ec and LMCache import beyond that image
# (found by importing gpu/check.py with only the image's packages installed).
# .whl/ is ignored through .git/info/exclude, never committed. About 25 MB.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
    lmcache==0.5.6
    # LMCache's imports outside the image
    aiofile==3.12.3 caio==0.12.10 cachetools==8.0.2 cryptography==50.0.2 cffi==2.1.1
    pycparser==3.12 msgspec==0.22.0 pyzmq==27.3.0
    # lmcache-ec's
    platformdirs==4.14.8
)

exclude=$(git rev-parse --git-common-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
rm -rf .whl
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1 \
    manylinux_2_24 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
    platforms+=(--platform "${tag}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl "${WHEELS[@]}"
ls -la .whl
du -sh .whl
