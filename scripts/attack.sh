#!/usr/bin/env bash
# Loopback attack on a live `mooncake master` and `mooncake store` while a client works:
# an idle connection flood (> 1,024) on the master's RPC port, 100 connections sending 15 MiB of
# a 16 MiB frame and stalling, and an idle flood on the store node's data port, all at once.
# Prints the client's success rate and p99 (unattacked first, then attacked) and the master's
# and node's memory before / during / after. docs/security.md explains the limits it exercises.
#
#   scripts/attack.sh [extra flags for the attack program, e.g. --attack-secs 30]
#
# Everything runs on 127.0.0.1 (plus 127.0.0.2-7 as attacker source addresses). The build comes
# first and is not bounded; the attack itself is bounded to 2 minutes. PROFILE=dev builds faster.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${PROFILE:-release}
cargo build --profile "$profile" -p mooncake-cli --bin mooncake -p mooncake-rpc --example attack
case "$profile" in dev) out=target/debug ;; *) out=target/$profile ;; esac

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# The floods hold thousands of sockets on each side.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# Waits (at most 20 s) until $1 contains a line matching $2; prints that line.
wait_for_line() {
    local file=$1 pattern=$2
    for _ in $(seq 200); do
        if grep -m1 -e "$pattern" "$file" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "attack.sh: no '$pattern' in $file after 20 s:" >&2
    cat "$file" >&2
    return 1
}

MOONCAKE_LOG=warn "$out/mooncake" master --rpc_address=127.0.0.1 --port=0 \
    --metrics_host=127.0.0.1 --metrics_port=0 >"$work/master.out" 2>"$work/master.err" &
master_pid=$!
pids+=("$master_pid")
master_line=$(wait_for_line "$work/master.out" "listening")
rpc=$(echo "$master_line" | sed -E 's/.* rpc ([0-9.:]+) .*/\1/')

MOONCAKE_LOG=warn "$out/mooncake" store --master "$rpc" --segment-size 512MiB \
    --host 127.0.0.1 >"$work/node.out" 2>"$work/node.err" &
node_pid=$!
pids+=("$node_pid")
node_line=$(wait_for_line "$work/node.out" "endpoint")
endpoint=$(echo "$node_line" | sed -E 's/.* endpoint ([^ ]+) .*/\1/')

echo "master $rpc (pid $master_pid), store node $endpoint (pid $node_pid)" >&2
status=0
timeout 120 "$out/examples/attack" --master "$rpc" --node-data "$endpoint" \
    --master-pid "$master_pid" --node-pid "$node_pid" "$@" || status=$?
if ! kill -0 "$master_pid" 2>/dev/null || ! kill -0 "$node_pid" 2>/dev/null; then
    echo "attack.sh: the master or the node died during the attack" >&2
    tail -20 "$work/master.err" "$work/node.err" >&2 || true
    status=1
fi
exit "$status"
