#!/usr/bin/env bash
# Runs upstream's benchmark harness (upstream_bench.py; not part of this repository: PEER_DIR
# names its directory) unchanged against a mooncake-rs master with
# `--module mooncake_rs.store`, and (if its venv exists) upstream's wheel against upstream's
# master right after, on the same machine; writes both tables to $OUT (default python/bench/results).
# usage: run_bench.sh [--no-upstream] [-- extra upstream_bench.py args]
# env: VENV (ours, default python/.venv, built by run_tests.sh), UPSTREAM_VENV (default
#      ${TMPDIR:-/tmp}/mc-venv, see the harness's README), SECONDS_PER_CASE (default 3)
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PEER="${PEER_DIR:?set PEER_DIR to the directory of the upstream benchmark harness (upstream_bench.py, run_upstream.sh)}"
VENV="${VENV:-$HERE/../.venv}"
UPSTREAM_VENV="${UPSTREAM_VENV:-${TMPDIR:-/tmp}/mc-venv}"
OUT="${OUT:-$HERE/results}"
SECS="${SECONDS_PER_CASE:-3}"
UPSTREAM=1
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-upstream) UPSTREAM=0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown arg $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no venv at $VENV: run python/run_tests.sh first" >&2; exit 1; }

MASTER_PID=""
cleanup() {
  if [ -n "$MASTER_PID" ] && kill -0 "$MASTER_PID" 2>/dev/null; then
    kill -TERM "$MASTER_PID"; wait "$MASTER_PID" 2>/dev/null
  fi
  MASTER_PID=""
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cd "$OUT"
"$PY" -m mooncake_rs.master --port=0 --rpc_address=127.0.0.1 --metrics_host=127.0.0.1 \
  --metrics_port=0 >"$OUT/rs_master.log" 2>&1 &
MASTER_PID=$!
ADDR=""
for _ in $(seq 1 100); do
  ADDR=$(sed -n 's/^mooncake master listening: rpc \([0-9.:]*\).*/\1/p' "$OUT/rs_master.log")
  [ -n "$ADDR" ] && break
  kill -0 "$MASTER_PID" 2>/dev/null || break
  sleep 0.2
done
[ -n "$ADDR" ] || { echo "master did not start" >&2; cat "$OUT/rs_master.log" >&2; exit 1; }
echo "== mooncake_rs.store against mooncake-rs master $ADDR" >&2
rc=0
timeout 900 "$PY" "$PEER/upstream_bench.py" --module mooncake_rs.store --master "$ADDR" \
  --metadata P2PHANDSHAKE --local-hostname 127.0.0.1 --seconds "$SECS" \
  --json "$OUT/rs.json" "${EXTRA[@]}" >"$OUT/rs_results.txt" 2>"$OUT/rs_bench.log" || rc=$?
cat "$OUT/rs_results.txt"
cleanup

if [ "$UPSTREAM" = 1 ] && [ -x "$UPSTREAM_VENV/bin/python" ]; then
  echo "== upstream wheel, same machine, right after" >&2
  VENV="$UPSTREAM_VENV" SECONDS_PER_CASE="$SECS" bash "$PEER/run_upstream.sh" --no-redis \
    --no-nomemcpy --no-probe --out "$OUT/upstream" -- "${EXTRA[@]}" >/dev/null || rc=$?
  cat "$OUT/upstream/upstream_results.txt"
  "$PY" "$HERE/ratios.py" "$OUT/rs.json" "$OUT/upstream/upstream.json" "$PEER/reference/upstream_results.txt" | tee "$OUT/ratios.md"
fi
exit $rc
