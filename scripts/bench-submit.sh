#!/usr/bin/env bash
# SubmitJob throughput: a release scheduler over a fresh database on the
# local Postgres (synchronous_commit as the server has it, on by default),
# driven by `fmctl bench-submit`. Extra arguments go to bench-submit.
#
#   scripts/bench-submit.sh --clients 32 --jobs 20000
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
db="fmsched_bench_$$"
base="${DATABASE_URL%/*}"
cargo build --release --quiet -p scheduler-svc -p fmctl
psql "$DATABASE_URL" -qc "CREATE DATABASE $db"
echo "synchronous_commit=$(psql "$DATABASE_URL" -Atc 'show synchronous_commit') fsync=$(psql "$DATABASE_URL" -Atc 'show fsync')"
token="bench-token-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
port=$(( 20000 + RANDOM % 20000 ))
FMSCHED_DATABASE_URL="$base/$db" FMSCHED_LISTEN_ADDR="127.0.0.1:$port" \
  FMSCHED_API_TOKENS="bench=$token" FMSCHED_JOIN_TOKEN="join-$token" FMSCHED_LOG__FILTER=warn \
  FMSCHED_DATABASE_MAX_CONNECTIONS="${DB_CONNECTIONS:-32}" \
  target/release/scheduler-svc & sched=$!
trap 'kill $sched 2>/dev/null; wait $sched 2>/dev/null; psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
for _ in $(seq 1 100); do
  FMSCHED_TOKEN=$token target/release/fmctl --endpoint "http://127.0.0.1:$port" summary >/dev/null 2>&1 && break
  sleep 0.1
done
FMSCHED_TOKEN=$token target/release/fmctl --endpoint "http://127.0.0.1:$port" bench-submit "$@"
