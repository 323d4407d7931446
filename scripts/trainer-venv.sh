#!/usr/bin/env bash
# Prints the path of a Python that can run the real example trainers
# (python/fmsched_trainer/examples: PyTorch + HF transformers), creating
# its virtual environment first when it is missing or its pinned
# requirements (python/requirements-real.txt) changed.
#
# The environment lives outside the checkout, so every clone reuses it:
#   ${FMSCHED_TRAINER_VENV:-${XDG_CACHE_HOME:-~/.cache}/fmsched/trainer-venv}
# First creation downloads PyTorch with its CUDA libraries from PyPI
# (5.9 GiB installed; about 2½ minutes on a fresh machine, downloads
# included); a changed pin is installed into the existing environment, and
# later runs only compare the requirements file.
#
#   python=$(scripts/trainer-venv.sh)   # progress on stderr, path on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${FMSCHED_TRAINER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fmsched/trainer-venv}"
req=python/requirements-real.txt
stamp="$venv/fmsched-requirements.txt"

if [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi

started=$(date +%s)
echo "==> creating the trainer environment in $venv (PyTorch + transformers; a few GiB, once)" >&2
mkdir -p "$(dirname "$venv")"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2 || {
    echo "python3 -m venv failed: install python3-venv (Debian) and run again" >&2
    exit 1
  }
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet --progress-bar off -r "$req" >&2
"$venv/bin/python" -c 'import torch, transformers, accelerate' >&2
cp "$req" "$stamp"
echo "==> trainer environment ready in $(( $(date +%s) - started )) s: $(du -sh "$venv" | cut -f1)" >&2
echo "$venv/bin/python"
