#!/usr/bin/env bash
# Failover under load, many times: a real etcd, two `mooncake master --enable_ha` on fixed
# ports, two store nodes and a writer/reader given both masters; the leader is SIGKILLed each
# round and restarted as a standby. Fails if an acknowledged put is lost or wrong or a removed
# key comes back; prints the time from each kill to the first acknowledged write (p50/p99).
# The regular test suite runs the same test with 10 rounds.
#
#   scripts/ha-failover-loop.sh          # 100 rounds
#   ROUNDS=20 scripts/ha-failover-loop.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export HA_FAILOVER_ROUNDS="${ROUNDS:-100}"
cargo test --release -p mooncake-cli --test ha_failover failover_loop -- --nocapture 2>&1 \
  | grep -E "^failover: |test result|panicked|FAILED"
