#!/usr/bin/env bash
# SIGKILL crash tests of the SSD-tier backends at scale: KILL_POINTS per durability policy
# (none, batch, always) per backend, in the release profile. Default 80 → 240 kill points per
# backend. The regular test suite runs the same harness with fewer kill points.
#
#   scripts/crash-storage.sh            # every backend
#   KILL_POINTS=200 scripts/crash-storage.sh file
set -euo pipefail
cd "$(dirname "$0")/.."
export STORAGE_CRASH_KILL_POINTS="${KILL_POINTS:-80}"
backends=("$@")
[ ${#backends[@]} -eq 0 ] && backends=(file bucket log)
args=()
for b in "${backends[@]}"; do
  if [ -f "crates/storage/tests/crash_${b}.rs" ]; then
    args+=(--test "crash_${b}")
  else
    echo "NOTICE: no crates/storage/tests/crash_${b}.rs; backend ${b} skipped" >&2
  fi
done
cargo test --release -p mooncake-storage "${args[@]}" -- --nocapture --test-threads=1 2>&1 \
  | grep -oE "crash [a-z]+/[a-z]+: .*|test result.*|panicked.*|FAILED.*"
