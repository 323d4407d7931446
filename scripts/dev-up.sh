#!/usr/bin/env bash
# Starts the whole fmsched stack locally: Postgres (a throw-away one in
# .fmsched-dev/ when DATABASE_URL is unset), estimator-svc, scheduler-svc and
# two node agents with FAKE (simulated) GPUs; submits the example jobs and
# shows `fmctl jobs` and `fmctl nodes`. Ctrl-C stops everything.
#
#   scripts/dev-up.sh           # run until Ctrl-C
#   scripts/dev-up.sh --once    # show the cluster, then stop (smoke test)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dev="$root/.fmsched-dev"
once=0
[ "${1:-}" = "--once" ] && once=1
mkdir -p "$dev/logs"

log() { printf '\033[1m==> %s\033[0m\n' "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

pids=()
cleanup() {
  log "stopping"
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${pg_bin:-}" ] && [ -f "$dev/pg/postmaster.pid" ]; then
    $pg_as "$pg_bin/pg_ctl" -D "$dev/pg" -m fast stop >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT INT TERM

"$root/scripts/ensure-build-tools.sh"
log "building fmsched (cargo build --bins)"
cargo build --workspace --bins --quiet
bin="$root/target/debug"

# --- Postgres ------------------------------------------------------------
if [ -z "${DATABASE_URL:-}" ]; then
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
  if [ -z "$pg_bin" ]; then
    log "installing PostgreSQL (Debian packages)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
  fi
  # Postgres refuses to run as root: use the postgres system user then.
  pg_as=""
  if [ "$(id -u)" = 0 ]; then pg_as="runuser -u postgres --"; fi
  port=55432
  if [ ! -f "$dev/pg/PG_VERSION" ]; then
    log "creating a throw-away Postgres in $dev/pg"
    mkdir -p "$dev/pg"
    [ -n "$pg_as" ] && chown postgres "$dev/pg"
    $pg_as "$pg_bin/initdb" -D "$dev/pg" -U postgres --auth=trust >/dev/null
  fi
  [ -n "$pg_as" ] && chown postgres "$dev/logs"
  $pg_as "$pg_bin/pg_ctl" -D "$dev/pg" -l "$dev/logs/postgres.log" -w \
    -o "-p $port -k /tmp -c listen_addresses=127.0.0.1" start >/dev/null
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
fi
log "Postgres: $DATABASE_URL"

# --- secrets -------------------------------------------------------------
if [ ! -f "$dev/secrets.env" ]; then
  rand() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
  cat > "$dev/secrets.env" <<EOT
FMSCHED_JOIN_TOKEN=$(rand)
DEV_ADMIN_TOKEN=$(rand)
DEV_USER_TOKEN=$(rand)
EOT
  chmod 600 "$dev/secrets.env"
fi
# shellcheck disable=SC1091
. "$dev/secrets.env"
export FMSCHED_JOIN_TOKEN
export FMSCHED_API_TOKENS="admin=$DEV_ADMIN_TOKEN,alice=$DEV_USER_TOKEN"
export FMSCHED_ENDPOINT="http://127.0.0.1:50051"
export FMSCHED_TOKEN="$DEV_USER_TOKEN"

# --- services ------------------------------------------------------------
log "starting estimator-svc on 127.0.0.1:50052"
"$bin/estimator-svc" --listen-addr 127.0.0.1:50052 >"$dev/logs/estimator.log" 2>&1 & pids+=($!)
log "starting scheduler-svc on 127.0.0.1:50051"
FMSCHED_DATABASE_URL="$DATABASE_URL" FMSCHED_AUTH__ADMINS=admin FMSCHED_LIVENESS__HEARTBEAT_INTERVAL=2s \
  FMSCHED_SCHEDULING__INTERVAL=2s FMSCHED_ESTIMATES__ENDPOINT=http://127.0.0.1:50052 \
  "$bin/scheduler-svc" >"$dev/logs/scheduler.log" 2>&1 & pids+=($!)
for _ in $(seq 1 100); do
  "$bin/fmctl" summary >/dev/null 2>&1 && break
  kill -0 "${pids[1]}" 2>/dev/null || { echo "scheduler-svc exited; see $dev/logs/scheduler.log" >&2; tail -5 "$dev/logs/scheduler.log" >&2; exit 1; }
  sleep 0.2
done
log "starting two node agents with FAKE GPUs (node-a: 4x A100-80GB, node-b: 4x H100-80GB)"
# The agents find the fake trainer (the demo jobs' command) on PATH. On
# this one-user development stack the demo trainers run as your own user
# (processes.allow_agent_user); a shared cluster sets processes.run_as.
export FMSCHED_AGENT_PROCESSES__ALLOW_AGENT_USER=true
PATH="$bin:$PATH" FMSCHED_AGENT_PROCESSES__WORK_DIR="$dev/node-a" \
  "$bin/node-agent" --scheduler "$FMSCHED_ENDPOINT" --node-id node-a --fake-gpus 4 --fake-gpu-model A100-80GB \
  --label rack=r1 >"$dev/logs/node-a.log" 2>&1 & pids+=($!)
PATH="$bin:$PATH" FMSCHED_AGENT_PROCESSES__WORK_DIR="$dev/node-b" \
  "$bin/node-agent" --scheduler "$FMSCHED_ENDPOINT" --node-id node-b --fake-gpus 4 --fake-gpu-model H100-80GB \
  --label rack=r2 >"$dev/logs/node-b.log" 2>&1 & pids+=($!)

log "submitting the demo jobs (examples/demo/, FAKE trainer) as alice"
"$bin/fmctl" submit examples/demo/*.yaml
# Let both agents register and send a heartbeat with telemetry.
for _ in $(seq 1 50); do
  n=$("$bin/fmctl" -o json nodes | grep -c '"utilization_percent"' || true)
  [ "$n" -ge 8 ] && break
  sleep 0.2
done

log "waiting for the scheduler to place and finish them (a few seconds)"
for _ in $(seq 1 300); do
  jobs_json=$("$bin/fmctl" -o json jobs)
  grep -q '"state": *"\(submitted\|profiling\|queued\|running\)"' <<<"$jobs_json" || break
  sleep 0.2
done
log "fmctl jobs"
"$bin/fmctl" jobs
echo
log "fmctl nodes"
FMSCHED_TOKEN="$DEV_ADMIN_TOKEN" "$bin/fmctl" nodes
echo
log "fmctl summary"
FMSCHED_TOKEN="$DEV_ADMIN_TOKEN" "$bin/fmctl" summary

if [ "$once" = 1 ]; then exit 0; fi
cat <<EOT

The stack is running. In another shell:
  export FMSCHED_ENDPOINT=$FMSCHED_ENDPOINT
  export FMSCHED_TOKEN=\$(grep DEV_USER_TOKEN $dev/secrets.env | cut -d= -f2)    # alice; DEV_ADMIN_TOKEN for admin
  $bin/fmctl jobs | job ID | watch ID | cancel ID | nodes | summary
  grpcurl -plaintext 127.0.0.1:50051 list
Logs: $dev/logs/. Press Ctrl-C to stop.
EOT
wait
