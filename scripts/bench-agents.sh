#!/usr/bin/env bash
# Scheduler cost at scale: a release scheduler (admin API tokens, metrics on)
# over a fresh database on the local Postgres, driven by `fmctl
# bench-agents` — N simulated agents speaking the real agent protocol, M
# jobs run by simulated processes. Extra arguments go to bench-agents.
#
#   scripts/bench-agents.sh --agents 250 --jobs 1000 --duration 120s
#
# The scheduler rounds every 2 s unless FMSCHED_SCHEDULING__INTERVAL says
# otherwise (its own default, Ymir's 120 s, leaves a short run without a
# single round); liveness windows are its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
db="fmsched_swarm_$$"
base="${DATABASE_URL%/*}"
cargo build --release --quiet -p scheduler-svc -p fmctl
psql "$DATABASE_URL" -qc "CREATE DATABASE $db"
token="bench-token-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
port=$(( 20000 + RANDOM % 20000 ))
mport=$(( port + 1 ))
# Each simulated agent holds a stream; the scheduler and this process each
# keep a socket per connection.
ulimit -n 65536 2>/dev/null || true
FMSCHED_DATABASE_URL="$base/$db" FMSCHED_LISTEN_ADDR="127.0.0.1:$port" \
  FMSCHED_METRICS_ADDR="127.0.0.1:$mport" FMSCHED_SCHEDULING__INTERVAL="${FMSCHED_SCHEDULING__INTERVAL:-2s}" \
  FMSCHED_API_TOKENS="bench=$token" FMSCHED_AUTH__ADMINS=bench FMSCHED_JOIN_TOKEN="join-$token" \
  FMSCHED_LOG__FILTER="${FMSCHED_LOG__FILTER:-warn}" \
  target/release/scheduler-svc & sched=$!
trap 'kill $sched 2>/dev/null; wait $sched 2>/dev/null; psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
for _ in $(seq 1 100); do
  FMSCHED_TOKEN=$token target/release/fmctl --endpoint "http://127.0.0.1:$port" summary >/dev/null 2>&1 && break
  sleep 0.1
done
FMSCHED_TOKEN=$token FMSCHED_JOIN_TOKEN="join-$token" \
  target/release/fmctl --endpoint "http://127.0.0.1:$port" bench-agents \
  --scheduler-metrics "127.0.0.1:$mport" "$@"
