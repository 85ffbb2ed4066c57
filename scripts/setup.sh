#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1 || { echo "setup: $1 is required but not installed: $2" >&2; exit 1; }; }
need cargo "install Rust from https://rustup.rs"

echo "setup: everything the tests need is in place"
