#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (scripts/setup.sh),
# then runs every test of the workspace. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
  # nextest does not run doctests.
  cargo test --workspace --doc --quiet
else
  echo "cargo-nextest not found; using cargo test" >&2
  cargo test --workspace --no-fail-fast "$@"
fi
