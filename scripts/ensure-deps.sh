#!/bin/sh
# Installs the Debian packages lpx needs when they are missing: with
# apt-get when run as root, otherwise prints the exact command and fails.
# Quiet when everything is there.
set -e
PKGS="gcc g++ make meson ninja-build pkg-config python3 libffi-dev uthash-dev libopenblas-dev libcjson-dev"
# `ensure-deps.sh test`: also what the suite exercises beyond the build
# (Open MPI, so the lpx-mpi.so plugin is built and run with mpirun; clang
# and its libFuzzer runtime for the fuzz targets of tests/fuzz/).
[ "${1:-}" = test ] && PKGS="$PKGS libopenmpi-dev openmpi-bin clang libclang-rt-14-dev"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
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
