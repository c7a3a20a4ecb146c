#!/bin/sh
# Sets a meson option of a configured build directory when it differs
# (meson configure only then, so an unchanged build is not reconfigured):
#
#   scripts/meson-option.sh BUILD NAME VALUE
#
# `make test` uses it for -Dcuda=enabled where nvcc is (the CUDA code must
# compile in CI), in the build/ that `make demo` configured with auto.
set -e
build=${1:?usage: meson-option.sh BUILD NAME VALUE} name=${2:?} want=${3:?}
cur=$(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
print(next((str(o["value"]) for o in json.load(sys.stdin) if o["name"] == sys.argv[1]), ""))' "$name")
if [ "$cur" != "$want" ]; then
    echo "lpx: configuring $build with -D$name=$want (was ${cur:-unset})"
    meson configure "$build" "-D$name=$want" >/dev/null
fi
