#!/usr/bin/env bash
# A soak under faults: `./scripts/soak.sh MINUTES [tidemark-soak flags]`. Starts a whole cluster
# on this machine — its own PostgreSQL, moto (three mounted buckets with their queues, the blob
# store), two filers with S3 gateways, two admins, three workers, one subscription per topology
# — drives it for MINUTES while a random Tidemark process is SIGKILLed, paused or restarted every
# few seconds (and PostgreSQL once), then checks that nothing was lost or clobbered and that it
# converged, and prints the figures (crates/tidemark-soak). Exits 1 if a check failed (its logs
# are kept, and named).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-2}
shift || true

./scripts/setup.sh
cargo build --release -p tidemark -p tidemark-soak

logs=$(mktemp -d -t tidemark-soak-moto-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m moto.server -H 127.0.0.1 -p "$port" >"$logs/moto.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do curl -s -o /dev/null "http://127.0.0.1:$port/moto-api/" && break; sleep 0.1; done
export TIDEMARK_TEST_MOTO="http://127.0.0.1:$port"

./target/release/tidemark-soak --minutes "$minutes" --tidemark ./target/release/tidemark "$@"
