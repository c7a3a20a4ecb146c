#!/bin/sh
# Installs the Debian packages lpx needs when they are missing: with
# apt-get when run as root, otherwise prints the exact command and fails.
# Quiet when everything is there.
set -e
PKGS="gcc g++ make meson ninja-build pkg-config python3 libffi-dev uthash-dev libopenblas-dev libcjson-dev"
# `ensure-deps.sh test`: also what the suite exercises beyond the build
# (Open MPI, so the lpx-mpi.so plugin is built and run with mpirun; clang
# and its libFuzzer runtime for the fuzz targets of tests/fuzz/; numpy
# for the Python binding's tests under /usr/bin/python3).
[ "${1:-}" = test ] && PKGS="$PKGS libopenmpi-dev openmpi-bin clang libclang-rt-14-dev python3-numpy"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# The binding's tests also run under the first python3 on PATH when it is
# another interpreter (tests/meson.build): it needs numpy, and safetensors
# for the interop case; pip installs them into that interpreter.
py_missing=""
if [ "${1:-}" = test ]; then
    py=$(command -v python3 || true)
    if [ -n "$py" ] && [ "$py" != /usr/bin/python3 ]; then
        for m in numpy safetensors; do
            "$py" -c "import $m" 2>/dev/null || py_missing="$py_missing $m"
        done
    fi
fi
if [ -n "$py_missing" ]; then
    echo "lpx: installing into $py:$py_missing"
    "$py" -m pip install -q --disable-pip-version-check$py_missing >/dev/null 2>&1 || {
        echo "lpx: could not install$py_missing into $py; run: $py -m pip install$py_missing" >&2
        exit 1
    }
fi
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "lpx: installing missing packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
else
    echo "lpx: missing packages:$missing" >&2
    echo "run:  sudo apt-get update && sudo apt-get install -y$missing" >&2
    exit 1
fi
