#!/bin/sh
# Installs the Debian packages lpx needs when they are missing: with
# apt-get when run as root, otherwise prints the exact command and fails.
# Quiet when everything is there. python3-cffi: the build generates the
# Python binding's declarations with it (python/lpx/_cdefgen.py), and the
# binding calls liblpx through it.
set -e
PKGS="gcc g++ make meson ninja-build pkg-config python3 python3-cffi libffi-dev uthash-dev libopenblas-dev libcjson-dev"
# `ensure-deps.sh test`: also what the suite exercises beyond the build
# (Open MPI, so the lpx-mpi.so plugin is built and run with mpirun; clang
# and its libFuzzer runtime for the fuzz targets of tests/fuzz/; numpy
# for the Python binding's tests under /usr/bin/python3, and venv for the
# test interpreter below).
[ "${1:-}" = test ] && PKGS="$PKGS libopenmpi-dev openmpi-bin clang libclang-rt-14-dev python3-numpy python3-venv"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
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
fi
# The suite's Python interpreter (tests/meson.build finds it first): a venv
# at .test-venv with tests/python/requirements.txt (numpy, safetensors,
# torch: the binding's DLPack and safetensors interop cases), so those cases
# run instead of skipping. Made again when the requirements change.
if [ "${1:-}" = test ]; then
    root=$(cd "$(dirname "$0")/.." && pwd)
    venv="$root/.test-venv" req="$root/tests/python/requirements.txt"
    if ! cmp -s "$req" "$venv/lpx-requirements.txt" 2>/dev/null; then
        echo "lpx: making the test interpreter $venv (pip: $(grep -v '^#' "$req" | tr '\n' ' '))"
        rm -rf "$venv"
        { /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"; } \
            >"$root/.test-venv.log" 2>&1 || {
            tail -20 "$root/.test-venv.log" >&2
            echo "lpx: could not make $venv (log: $root/.test-venv.log); run:" >&2
            echo "  /usr/bin/python3 -m venv $venv && $venv/bin/pip install -r $req" >&2
            rm -rf "$venv"
            exit 1
        }
        cp "$req" "$venv/lpx-requirements.txt"
    fi
fi
