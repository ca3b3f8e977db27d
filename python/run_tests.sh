#!/usr/bin/env bash
# Build the mooncake_rs Python package and run its pytest suite.
#
# Creates python/.venv (gitignored) if missing, installs maturin, ziglang, pytest and numpy from
# PyPI, builds the wheel with scripts/build-wheel (release; cargo output in $CARGO_TARGET_DIR or
# python/target; the wheel in python/dist), installs it, then runs pytest on python/tests.
# Extra arguments go to pytest.
# The tests start their own masters (python -m mooncake_rs.master) on 127.0.0.1, free ports.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${MOONCAKE_RS_VENV:-$HERE/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
    # Debian/Ubuntu ship venv separately.
    rm -rf "$VENV"
    if command -v apt-get >/dev/null; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv) >/dev/null
    fi
    "$PYTHON" -m venv "$VENV"
  fi
fi
export PATH="$VENV/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HERE/target}"
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python -m pip install -q "maturin>=1.5,<2" ziglang pytest numpy
# The distributable wheel (scripts/build-wheel: abi3, manylinux_2_28 through zig; extra flags in
# $BUILD_WHEEL_ARGS, e.g. --native), installed here and handed to test_wheel.py, which installs
# it again into a fresh venv.
# shellcheck disable=SC2086
WHEEL="$(PYTHON="$VENV/bin/python" "$HERE/../scripts/build-wheel" -o "$HERE/dist" ${BUILD_WHEEL_ARGS:-} | tail -n 1)"
python -m pip install -q --force-reinstall --no-deps "$WHEEL"
export MOONCAKE_RS_WHEEL="$WHEEL"
cd "$HERE/tests"
# `pytest` (not `python -m pytest`) so the source tree's mooncake_rs/ does not shadow the
# installed package.
exec "$VENV/bin/pytest" -q -p no:cacheprovider "$@" .
