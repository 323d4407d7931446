#!/usr/bin/env bash
# Installs (Debian packages) what building fmsched needs beyond Rust:
# HiGHS, the scheduler's MILP solver, is compiled from source by highs-sys,
# which needs cmake, a C++ compiler and libclang (for its bindings). The
# Python trainer helper's tests need python3.
set -euo pipefail
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || command -v clang++ >/dev/null || missing+=(g++)
ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || missing+=(libclang-dev)
# A test runs its own throw-away Postgres to restart it (Debian's binaries).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
# The Python trainer helper's tests (and its test under the agent).
command -v python3 >/dev/null || missing+=(python3 python3-pip)
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "==> installing build tools: ${missing[*]}"
if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
  echo "need root to install: ${missing[*]}" >&2; exit 1; fi
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
