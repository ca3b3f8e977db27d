#!/usr/bin/env bash
# One same-machine, same-hour comparison with upstream for BENCHMARKS.md:
#   1. upstream's wheel and master, through run_upstream.sh of upstream's benchmark
#      harness (PEER_DIR; not part of this repository; its venv must exist, or run it once with --setup);
#   2. `mooncake bench store` (default transport, then --transport tcp) with --upstream pointing
#      at the table of step 1, so every row carries ours ÷ upstream's ops/s;
#   3. upstream again, so a drift of the machine between the passes shows.
# usage: scripts/bench-vs-upstream.sh [OUT_DIR]   (default target/bench-vs-upstream/<UTC time>)
# env: SECONDS_PER_CASE (default 3), passed to both benches.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEER="${PEER_DIR:?set PEER_DIR to the directory of the upstream benchmark harness (upstream_bench.py, run_upstream.sh)}"
OUT="${1:-$ROOT/target/bench-vs-upstream/$(date -u +%Y%m%dT%H%M%SZ)}"
SECS="${SECONDS_PER_CASE:-3}"
mkdir -p "$OUT"
cargo build --release -q -p mooncake-cli --manifest-path "$ROOT/Cargo.toml"
BIN="$ROOT/target/release/mooncake"
run_upstream() {
  SECONDS_PER_CASE="$SECS" "$PEER/run_upstream.sh" --no-redis --no-nomemcpy --no-probe \
    --out "$OUT/$1" >"$OUT/$1.log" 2>&1
}
echo "== upstream (before), $(date -u +%T)"; run_upstream upstream-before
for transport in auto tcp; do
  echo "== mooncake-rs, transport $transport, $(date -u +%T)"
  "$BIN" bench store --transport "$transport" --seconds "$SECS" \
    --upstream "$OUT/upstream-before/upstream_results.txt" | tee "$OUT/ours-$transport.txt"
done
echo "== upstream (after), $(date -u +%T)"; run_upstream upstream-after
echo "tables in $OUT (upstream-*/upstream_results.txt, ours-*.txt)"
