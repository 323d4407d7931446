#!/usr/bin/env bash
# The real path on this host, end to end: a throw-away Postgres, the
# scheduler, one node agent and two jobs of the real PyTorch/HuggingFace
# example trainer (`fmsched_trainer.examples.glue --tiny`: a small randomly
# initialised RoBERTa on synthetic sentiment data written here, so nothing
# is downloaded). With an NVIDIA GPU (nvidia-smi lists one) the agent uses
# NVML and the jobs ask for every GPU of the host; otherwise it simulates 4
# (FAKE) GPUs and the trainer runs on the CPU.
#
#   scripts/real-run.sh [--scenario suspend|merge] [--bin DIR] [--python PY]
#                       [--out DIR] [--iterations N] [--fake-gpus N] [--amp]
#
# suspend (default): UniSched. Job A (best effort) is profiled, runs and
#   checkpoints; job B arrives with a deadline and takes the GPUs; A is
#   suspended, resumes from its checkpoint and completes after B.
# merge: Ymir. Two jobs on related data arrive together; the merger pairs
#   them and the pair runs as decided (temporal: B starts from A's output
#   weights; spatial: one process trains both).
#
# Prints `fmctl nodes` while A runs (NVML telemetry), the agent's
# DCGM-named metrics, every job event and the figures read off the
# trainers' logs; writes them and all logs to --out (default: a new folder
# under /tmp). --amp: the jobs train in mixed precision (bf16 where the GPU
# has it; ignored, and said so, on the CPU). --bin: where scheduler-svc, node-agent and fmctl are
# (default: `cargo build --bins` into target/debug). --python: a Python with
# torch and transformers (default: $REAL_TRAINER_PYTHON, else
# scripts/trainer-venv.sh). Postgres: $DATABASE_URL when set (the scheduler
# migrates that database), else a throw-away cluster made with $PG_BIN or
# /usr/lib/postgresql/*/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

scenario=suspend bin="" python="${REAL_TRAINER_PYTHON:-}" out="" iterations="" fake="" amp=false
while [ $# -gt 0 ]; do
  case "$1" in
    --scenario) scenario=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --iterations) iterations=$2; shift 2 ;;
    --fake-gpus) fake=$2; shift 2 ;;
    --amp) amp=true; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "real-run: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$scenario" in suspend|merge) ;; *) echo "real-run: --scenario is suspend or merge, not $scenario" >&2; exit 2 ;; esac

log() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { echo "real-run: $*" >&2; exit 1; }

if [ -z "$bin" ]; then
  "$root/scripts/ensure-build-tools.sh"
  log "building fmsched (cargo build --bins)"
  cargo build --workspace --bins --quiet
  bin="$root/target/debug"
fi
for b in scheduler-svc node-agent fmctl; do
  [ -x "$bin/$b" ] || die "$bin/$b is missing (--bin names the folder with scheduler-svc, node-agent and fmctl)"
done
[ -n "$python" ] || python=$("$root/scripts/trainer-venv.sh")
"$python" -c 'import torch, transformers' 2>/dev/null \
  || die "$python cannot import torch and transformers (--python, or scripts/trainer-venv.sh)"

[ -n "$out" ] || out=$(mktemp -d /tmp/fmsched-real-run.XXXXXX)
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
# Postgres may run as another user (below): it must reach its folder.
chmod 755 "$out" "$out/logs"
work="$out/work"
mkdir -p "$work"

pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${pg_bin:-}" ] && [ -f "$out/pg/postmaster.pid" ]; then
    $pg_as "$pg_bin/pg_ctl" -D "$out/pg" -m fast stop >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT INT TERM

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- Postgres ------------------------------------------------------------
if [ -z "${DATABASE_URL:-}" ]; then
  pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)}
  [ -x "$pg_bin/initdb" ] || die "no PostgreSQL here: set DATABASE_URL, or PG_BIN to a folder with initdb and pg_ctl"
  # Postgres refuses to run as root.
  pg_as=""
  mkdir -p "$out/pg"
  if [ "$(id -u)" = 0 ]; then
    pg_user=postgres
    id postgres >/dev/null 2>&1 || pg_user=nobody
    pg_as="runuser -u $pg_user --"
    chown "$pg_user" "$out/pg" "$out/logs"
  fi
  pg_port=$(free_port)
  log "a throw-away Postgres in $out/pg on port $pg_port"
  $pg_as "$pg_bin/initdb" -D "$out/pg" -U postgres --auth=trust >"$out/logs/initdb.log" 2>&1 \
    || { cat "$out/logs/initdb.log" >&2; die "initdb failed"; }
  $pg_as "$pg_bin/pg_ctl" -D "$out/pg" -l "$out/logs/postgres.log" -w \
    -o "-p $pg_port -k $out/pg -c listen_addresses=127.0.0.1" start >/dev/null
  DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
fi

# --- scheduler and agent -------------------------------------------------
rand() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
join=$(rand) admin=$(rand) user=$(rand)
port=$(free_port) metrics=$(free_port)
export FMSCHED_ENDPOINT="http://127.0.0.1:$port" FMSCHED_TOKEN="$user"
fmctl() { "$bin/fmctl" "$@"; }
admin() { FMSCHED_TOKEN="$admin" "$bin/fmctl" "$@"; }

if [ "$scenario" = suspend ]; then
  # Leases well above a Python trainer's start-up (seconds): shorter ones
  # hand the GPUs back and forth faster than either process starts.
  policy=(FMSCHED_SCHEDULING__POLICY=unisched FMSCHED_SCHEDULING__KNOBS__BE_LEASE_S=20
          FMSCHED_SCHEDULING__KNOBS__SLO_LEASE_S=60)
else
  policy=(FMSCHED_SCHEDULING__POLICY=ymir)
fi
log "scheduler-svc on 127.0.0.1:$port (${policy[0]#*=})"
env "${policy[@]}" FMSCHED_DATABASE_URL="$DATABASE_URL" FMSCHED_LISTEN_ADDR="127.0.0.1:$port" \
  FMSCHED_API_TOKENS="admin=$admin,alice=$user" FMSCHED_AUTH__ADMINS=admin FMSCHED_JOIN_TOKEN="$join" \
  FMSCHED_LIVENESS__HEARTBEAT_INTERVAL=1s FMSCHED_SCHEDULING__INTERVAL=2s RUST_LOG=info \
  "$bin/scheduler-svc" >"$out/logs/scheduler.log" 2>&1 & pids+=($!)
for _ in $(seq 1 150); do
  fmctl summary >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { tail -5 "$out/logs/scheduler.log" >&2; die "scheduler-svc exited"; }
  sleep 0.2
done

gpus=()
if [ -z "$fake" ] && command -v nvidia-smi >/dev/null && n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') && [ "$n" -gt 0 ]; then
  ngpu=$n
  log "node agent on this host's $ngpu NVIDIA GPU(s) (NVML)"
  nvidia-smi -L
else
  ngpu=${fake:-4}
  gpus=(--fake-gpus "$ngpu" --fake-gpu-model A100-80GB)
  log "node agent with $ngpu FAKE GPUs (no NVIDIA GPU here): the trainer runs on the CPU"
fi
FMSCHED_JOIN_TOKEN="$join" FMSCHED_AGENT_ADDRESS=127.0.0.1 FMSCHED_AGENT_METRICS_ADDR="127.0.0.1:$metrics" \
  FMSCHED_AGENT_PROCESSES__WORK_DIR="$work" FMSCHED_AGENT_PROCESSES__GRACE=30s \
  FMSCHED_AGENT_PROCESSES__ALLOW_AGENT_USER=true \
  FMSCHED_AGENT_PROCESSES__CHECKPOINT_TIMEOUT=30s FMSCHED_AGENT_PROCESSES__CHECKPOINT_INTERVAL=2s \
  RUST_LOG=info "$bin/node-agent" --scheduler "$FMSCHED_ENDPOINT" --node-id real-node "${gpus[@]}" \
  >"$out/logs/agent.log" 2>&1 & pids+=($!)
for _ in $(seq 1 150); do
  admin -o json nodes 2>/dev/null | grep -q '"utilization_percent"' && break
  kill -0 "${pids[1]}" 2>/dev/null || { tail -5 "$out/logs/agent.log" >&2; die "node-agent exited"; }
  sleep 0.2
done

# Telemetry as Prometheus scrapes it: the agent's /metrics every second.
"$python" - "$metrics" "$out/metrics.prom" <<'EOF' & pids+=($!)
import sys, time, urllib.request
port, path = sys.argv[1], sys.argv[2]
with open(path, "a") as f:
    while True:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            f.write(f"# at {time.time():.1f}\n" + body)
            f.flush()
        except OSError:
            pass
        time.sleep(1)
EOF

# What nvidia-smi says at the same moment as `fmctl nodes` (a cross-check).
smi() {
  [ ${#gpus[@]} -eq 0 ] || return 0
  nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw \
    --format=csv | tee "$out/nvidia-smi.csv"
}

# --- jobs ----------------------------------------------------------------
data() { PYTHONPATH="$root/python" "$python" -m fmsched_trainer.examples.synthetic glue "$@" >/dev/null; }
job() { # name, data dir, target, samples, extra spec lines
  cat <<EOT
name: $1
model: roberta-base
dataset: { uri: "file://$2", task: $1, num_samples: $4, objective: sequence-classification }
hyperparameters: { global_batch_size: 16, learning_rate: 0.001, amp: $amp }
target: $3
resources: { min_gpus: $ngpu, max_gpus: $ngpu }
$5
launch:
  command: ["$python", -m, fmsched_trainer.examples.glue, --tiny, --profile-steps, "40", --logging-steps, "5"]
  env: { PYTHONPATH: "$root/python", HF_HUB_OFFLINE: "1", OMP_NUM_THREADS: "1" }
EOT
}
submit() { job "$@" >"$out/$1.yaml"; fmctl -o json submit "$out/$1.yaml" \
  | "$python" -c 'import json,sys; d=json.load(sys.stdin); print(d[0]["job"]["id"])'; }
state() { fmctl -o json job "$1" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }
training() { # id: running, and its process has begun to train
  [ "$(state "$1")" = running ] && fmctl logs "$1" --stderr 2>/dev/null | grep -q 'train from iteration'
}
wait_done() { # ids…: until every one is completed; fails on a failed one
  local until=$((SECONDS + 900)) id s all
  while :; do
    all=1
    for id in "$@"; do
      s=$(state "$id")
      case "$s" in completed) ;; failed|cancelled) fmctl logs "$id" --stderr | tail -20 >&2; die "job $id $s" ;; *) all=0 ;; esac
    done
    [ "$all" = 1 ] && return 0
    [ $SECONDS -lt $until ] || die "jobs not done after 15 min: $(fmctl jobs)"
    sleep 1
  done
}

if [ "$scenario" = suspend ]; then
  data "$work/sent-a"; data "$work/sent-b" --flip
  a=$(submit real-a "$work/sent-a" "{ max_iterations: ${iterations:-1500} }" 512 "")
  log "submitted A ($a); waiting for it to run and checkpoint"
  until=$((SECONDS + 300))
  until training "$a" && fmctl logs "$a" --stderr 2>/dev/null | grep -q ': checkpoint '; do
    case "$(state "$a")" in failed|cancelled) fmctl logs "$a" --stderr | tail -20 >&2; die "A $(state "$a")" ;; esac
    [ $SECONDS -lt $until ] || die "A never ran with a checkpoint"
    sleep 0.5
  done
  sleep 3 # a few seconds of steady training for the telemetry below
  log "fmctl nodes while A runs"
  admin nodes | tee "$out/nodes.txt"
  admin -o json nodes >"$out/nodes.json"
  smi
  deadline=$("$python" -c 'import datetime as d; print((d.datetime.now(d.timezone.utc)+d.timedelta(seconds=300)).isoformat())')
  b=$(submit real-b "$work/sent-b" "{ max_iterations: 300 }" 512 "deadline: \"$deadline\"
slo_class: slo")
  log "submitted B ($b) with a deadline 5 min away; waiting for both"
  wait_done "$a" "$b"
  ids=("$a" "$b")
else
  data "$work/sent-a" --train 2048 --seed 1; data "$work/sent-b" --train 2048 --seed 2
  target="{ max_epochs: 4, metric: { name: accuracy, value: 0.999 } }"
  a=$(submit real-a "$work/sent-a" "$target" 2048 "")
  b=$(submit real-b "$work/sent-b" "$target" 2048 "")
  log "submitted A ($a) and B ($b) together; waiting for both"
  # Until one of them trains (its process started and is on the device).
  until=$((SECONDS + 300))
  until training "$a" || training "$b"; do
    [ $SECONDS -lt $until ] || die "neither job trained"
    sleep 0.5
  done
  sleep 3
  log "fmctl nodes while the pair runs"
  admin nodes | tee "$out/nodes.txt"
  admin -o json nodes >"$out/nodes.json"
  smi
  wait_done "$a" "$b"
  ids=("$a" "$b")
fi

# --- what happened -------------------------------------------------------
log "fmctl jobs"
fmctl jobs | tee "$out/jobs.txt"
for id in "${ids[@]}"; do
  fmctl -o json watch "$id" >"$out/events-$id.jsonl"
  fmctl logs "$id" --tail 1000000 >"$out/logs/$id.stdout" || true
  fmctl logs "$id" --stderr --tail 1000000 >"$out/logs/$id.stderr" || true
  # The profiling run's output stays on the node, beside the job's folder.
  cp "$work/$id-profile/stderr.log" "$out/logs/$id.profile.stderr" 2>/dev/null || true
done
log "the agent's DCGM-named metrics (last scrape)"
"$python" - "$out/metrics.prom" <<'EOF' | tee "$out/dcgm.txt"
import sys
last = open(sys.argv[1]).read().split("# at ")[-1].splitlines()[1:]
print("\n".join(l for l in last if l.startswith("DCGM_")))
EOF
log "figures"
"$python" - "$out" "$scenario" "$ngpu" "${gpus[*]:-nvml}" "${ids[@]}" <<'EOF' | tee "$out/figures.txt"
import json, os, re, sys
from datetime import datetime
out, scenario, ngpu, backend, ids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
t = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))
print(f"scenario {scenario}; {ngpu} GPU(s), {'NVML' if backend == 'nvml' else 'FAKE GPUs, trainer on the CPU'}")
for name, id in zip("AB", ids):
    ev = [json.loads(l) for l in open(f"{out}/events-{id}.jsonl") if l.strip()]
    prof = f"{out}/logs/{id}.profile.stderr"
    err = (open(prof).read() if os.path.exists(prof) else "") + open(f"{out}/logs/{id}.stderr").read()
    std = open(f"{out}/logs/{id}.stdout").read()
    print(f"\njob {name} ({id})")
    for e in ev:
        print(f"  {e['time'][11:23]} {e['kind']:<14} {e.get('from_state') or '':>10} -> {e.get('to_state') or '':<10} {e['message'][:110]}")
    susp = [e for e in ev if e.get("from_state") == "running" and e.get("to_state") == "queued"]
    for s in susp:
        r = next((e for e in ev if e["sequence"] > s["sequence"] and e.get("to_state") == "running"), None)
        if r:
            print(f"  suspended at {s['time'][11:19]}, running again {(t(r['time']) - t(s['time'])).total_seconds():.1f} s later")
    first = next((e for e in ev if e.get("to_state") == "running"), None)
    done = next((e for e in ev if e.get("to_state") == "completed"), None)
    if first and done:
        print(f"  first running → completed: {(t(done['time']) - t(first['time'])).total_seconds():.1f} s")
    losses = [float(m) for m in re.findall(r"'loss': '?([0-9.eE+-]+)", std)]
    if losses:
        print(f"  loss {losses[0]:.3f} → {losses[-1]:.3f} over {len(losses)} reports")
    for pat in ["Task2Vec embedding of dimension", "profiled ", "train from iteration", "resuming from",
                ": checkpoint ", "stopped on SIGTERM", "after the process started", "weights from",
                "spatial merge", "watching ", "done", "amp:", "cuda", "GPU"]:
        lines = [l.strip() for l in err.splitlines() if pat in l]
        for l in (lines[:1] + lines[-1:] if len(lines) > 1 else lines):
            print(f"  | {l[:200]}")
# GPU telemetry over the run, from the agent's /metrics.
peak = {}
for l in open(f"{out}/metrics.prom"):
    m = re.match(r"(DCGM_FI_DEV_\w+)\{[^}]*\} ([0-9.eE+-]+)", l)
    if m:
        peak[m[1]] = max(peak.get(m[1], 0.0), float(m[2]))
print("\npeak over the run (agent /metrics, 1 s scrapes): " + ", ".join(f"{k[11:]} {v:g}" for k, v in sorted(peak.items())))
EOF
log "all written to $out"
