#!/usr/bin/env bash
# Runs every check and test of fmsched, installing what is missing:
# a Rust toolchain's rustfmt/clippy components, cargo-nextest (optional),
# the build tools of the HiGHS MILP solver (cmake, libclang; Debian
# packages), PostgreSQL when no server answers on DATABASE_URL, and the
# cached Python environment of the real example trainers (PyTorch,
# transformers; scripts/trainer-venv.sh).
#
#   scripts/test.sh            # fmt + clippy + all tests
#   scripts/test.sh --quick    # tests only
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
[ "${1:-}" = "--quick" ] && quick=1

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

log() { printf '==> [%4ds] %s\n' "$SECONDS" "$*"; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

pg_ready() {
  if command -v pg_isready >/dev/null; then
    pg_isready -q -d "$DATABASE_URL" 2>/dev/null
  else
    (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null
  fi
}

ensure_postgres() {
  if pg_ready; then return; fi
  log "PostgreSQL not answering at $DATABASE_URL; starting it"
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    log "installing PostgreSQL from Debian packages"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-client >/dev/null
  fi
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql/*/main >/dev/null 2>&1; then
    ver=$(ls /etc/postgresql | sort -V | tail -n1)
    # Trust local TCP connections for the test user, as CI machines do.
    hba="/etc/postgresql/$ver/main/pg_hba.conf"
    if ! as_root grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
      as_root sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    fi
    as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start || as_root pg_ctlcluster "$ver" main start
  else
    echo "cannot start PostgreSQL automatically; set DATABASE_URL to a reachable server" >&2
    exit 1
  fi
  for _ in $(seq 1 50); do pg_ready && return; sleep 0.2; done
  echo "PostgreSQL did not come up at $DATABASE_URL" >&2
  exit 1
}

scripts/ensure-build-tools.sh
ensure_postgres

if [ "$quick" = 0 ]; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
  log "cargo fmt --check"
  cargo fmt --all -- --check
  log "cargo clippy --all-targets -- -D warnings"
  cargo clippy --workspace --all-targets --locked -- -D warnings
  log "no module circles (scripts/module-circles.py)"
  python3 scripts/module-circles.py
fi

log "building binaries (the integration tests run them)"
cargo build --workspace --bins --locked

# The Python trainer helper (python/fmsched_trainer), without a GPU.
if command -v python3 >/dev/null; then
  log "python3 -m pytest python/tests"
  python3 -m pytest --version >/dev/null 2>&1 \
    || python3 -m pip install --quiet pytest \
    || python3 -m pip install --quiet --break-system-packages pytest
  (cd python && python3 -m pytest -q -p no:cacheprovider tests --ignore=tests/test_examples.py)
else
  echo "python3 not found: skipping the Python trainer helper's tests" >&2
fi

# The real example trainers (PyTorch + HF transformers, on the CPU): their
# own tests, and the e2e test that runs one under the real scheduler and
# agent. Their virtual environment is created once and cached outside the
# checkout (scripts/trainer-venv.sh).
log "the real trainer environment (scripts/trainer-venv.sh)"
REAL_TRAINER_PYTHON="$(scripts/trainer-venv.sh)"
export REAL_TRAINER_PYTHON REQUIRE_REAL_TRAINER=1
# Two at a time (pytest-xdist; FMSCHED_PYTEST_WORKERS to change): each test
# spends most of its time starting trainer processes that import PyTorch,
# and two side by side took 158 s against 285-364 s one at a time on 2 cores.
log "real example trainers: pytest python/tests/test_examples.py"
(cd python && "$REAL_TRAINER_PYTHON" -m pytest -q -p no:cacheprovider \
  -n "${FMSCHED_PYTEST_WORKERS:-2}" tests/test_examples.py)

if cargo nextest --version >/dev/null 2>&1; then
  # nextest does not run doctests; run them first so the run ends with
  # nextest's summary of every test.
  log "cargo test --doc"
  cargo test --workspace --doc --locked --quiet
  log "cargo nextest run --workspace"
  cargo nextest run --workspace --locked --no-fail-fast
else
  log "cargo test --workspace (install cargo-nextest for faster runs)"
  cargo test --workspace --locked --no-fail-fast
fi
log "all tests passed"
