#!/bin/sh
# Runs ninja in a build directory after one line saying how much it has to
# do, so that a long build is never silent:
#
#   scripts/ninja-progress.sh BUILD [TARGET...]
#   lpx: building [TARGET... in ]BUILD/ (N targets)   or   lpx: ... is up to date
#
# On a terminal ninja shows its own progress line ([k/N] ...); otherwise
# (a log, CI) it runs with --quiet and prints only errors. The count comes
# from a dry run (ninja -n), which costs a stat of each file.
set -e
build=${1:?usage: ninja-progress.sh BUILD [TARGET...]}
shift
# meson's regeneration first (after a meson.build or option change): a dry
# run would count only that step
if ! out=$(ninja -C "$build" build.ninja 2>&1); then
    printf '%s\n' "$out" | tail -30 >&2
    exit 1
fi
n=$(ninja -C "$build" -n "$@" 2>/dev/null | sed -n 's/^\[[0-9]*\/\([0-9]*\)\].*/\1/p' | tail -1)
what="$build/"
[ $# -gt 0 ] && what="$* in $build/"
if [ -n "$n" ]; then
    echo "lpx: building $what ($n targets)"
else
    echo "lpx: $what is up to date"
fi
if [ -t 1 ]; then
    exec ninja -C "$build" "$@"
fi
exec ninja -C "$build" --quiet "$@"
