#!/usr/bin/env bash
# Chaos soak (not in CI): SOAK_JOBS jobs (default 200) over SOAK_MINUTES
# (default 30) on two scheduler replicas, three fake-GPU agents and a
# private Postgres, while the soak kills the active replica, agents with
# their trainers and single trainer processes, and restarts Postgres, at
# random every 10–30 s. It ends with every job completed exactly once, or
# with the counterexample:
#
#   scripts/soak.sh                         # 30 minutes, 200 jobs
#   SOAK_MINUTES=10 SOAK_JOBS=100 scripts/soak.sh
#   SOAK_SEED=12345 scripts/soak.sh         # replay a run's chaos
#   SOAK_KEEP=1 scripts/soak.sh             # keep every process's log afterwards
#
# The last line is `lost=0 duplicated=0 healthy_restarts=0`. Needs what
# scripts/test.sh needs (Postgres's initdb/pg_ctl for the private server).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-build-tools.sh
cargo build --quiet --workspace --bins
if cargo nextest --version >/dev/null 2>&1; then
  exec cargo nextest run -p fmsched-integration --test e2e --run-ignored only \
    --no-capture --test-threads 1 soak_chaos
fi
exec cargo test -p fmsched-integration --test e2e -- --ignored --nocapture soak_chaos
