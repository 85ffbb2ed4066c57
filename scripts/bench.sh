#!/usr/bin/env bash
# The end-to-end benchmarks, from a clean clone: builds Tidemark in release, starts moto on a free
# port, runs a `tidemark server` against it and against a local bucket, and prints every figure
# docs/BENCHMARKS.md records. Usage: scripts/bench.sh [PUTS]   (default 1000)
set -euo pipefail
cd "$(dirname "$0")/.."
puts="${1:-1000}"

./scripts/setup.sh >/dev/null
cargo build --release -q -p tidemark -p tidemark-bench
bin=./target/release/tidemark
bench=./target/release/tidemark-bench
work=$(mktemp -d -t tidemark-bench-XXXXXX)
pids=()
. scripts/postgres.sh
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; stop_postgres; sleep 1; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_line() { # FILE PATTERN
  for _ in $(seq 1 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "bench: timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}

echo "== engine overhead (in-process bucket and queue) =="
"$bench" apply --events 10000 --concurrency 1
"$bench" apply --events 10000 --concurrency 8
echo "== engine overhead on the shared store (a throwaway PostgreSQL, fsync on like SQLite's FULL) =="
start_postgres on
for c in 1 8; do
  db="bench_apply_$c"
  psql -X -q -d "$TIDEMARK_TEST_POSTGRES" -c "CREATE DATABASE $db"
  "$bench" apply --events 10000 --concurrency "$c" --store "${TIDEMARK_TEST_POSTGRES%/*}/$db"
done
echo "== one filer, then two filers writing into the same PostgreSQL at once =="
for f in 1 2 1 2; do
  db="bench_filers_$RANDOM$f"
  psql -X -q -d "$TIDEMARK_TEST_POSTGRES" -c "CREATE DATABASE $db"
  "$bench" apply --events 40000 --filers "$f" --store "${TIDEMARK_TEST_POSTGRES%/*}/$db"
done
echo "== single conditional writes from 1 and 16 tasks at once, PostgreSQL and SQLite (group commit) =="
for t in 1 16; do
  db="bench_writes_$RANDOM$t"
  psql -X -q -d "$TIDEMARK_TEST_POSTGRES" -c "CREATE DATABASE $db"
  "$bench" writes --tasks "$t" --writes 5000 --store "${TIDEMARK_TEST_POSTGRES%/*}/$db"
  "$bench" writes --tasks "$t" --writes 5000
done
echo "== coalescing: a burst of 10,000 notifications over 100 keys =="
"$bench" apply --events 10000 --keys 100

port=$(free_port)
python3 -m moto.server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do curl -s -o /dev/null "http://127.0.0.1:$port/moto-api/" && break; sleep 0.1; done
moto="http://127.0.0.1:$port"

echo "== end to end against moto: apply throughput, API cost, reconcile vs the raw LIST =="
# Backlogs of 300: moto's ReceiveMessage scans the whole queue, so its cost grows with the
# backlog (docs/BENCHMARKS.md); 300 keeps the figures about Tidemark, not about moto.
"$bench" s3 --endpoint "$moto" --events 300 --concurrency 1,4,16 --objects 10000

echo "== the content cache against moto: cold read vs a plain GET, warm read vs a local file, small-file latency =="
"$bench" cache --endpoint "$moto" --size 256M --small 200 --rounds 5
echo "== the content cache, the bucket slower than the disk (a proxy capping each connection) =="
"$bench" cache --endpoint "$moto" --size 256M --small 50 --rounds 2 --throttle 100

echo "== the S3 gateway beside moto: cached 4 KiB GETs, a large cached GET vs a local file, 1 MiB PUTs =="
"$bench" gateway --endpoint "$moto" --size 256M --requests 1000 --puts 64
echo "== the S3 gateway, the bucket behind a proxy serving 100 MiB/s per connection: a cold GET vs a plain GET =="
"$bench" gateway --endpoint "$moto" --size 256M --requests 100 --puts 8 --throttle 100

echo "== file content on a blob store (--blob-store) against moto: a 256 MiB write and cold read vs a plain PUT/GET =="
"$bench" blobs --endpoint "$moto" --size 256M --rounds 3

echo "== the FUSE mount beside the local disk: a 1 GiB sequential read, ls -lR of 10,000 files, small-file reads =="
"$bench" mount --size 1G --files 10000 --small 200
echo "== the FUSE mount of a bucket (moto) beside a plain GET and rclone's mount: first read of 256 MiB, ls -lR of 1,000 objects =="
"$bench" mount --endpoint "$moto" --size 256M --files 1000 --peer rclone
echo "== the same, the bucket behind a proxy serving 100 MiB/s per connection (for every client alike) =="
"$bench" mount --endpoint "$moto" --size 256M --files 200 --peer rclone --throttle 100

# moto prepares one GET at a time (it copies the object for each), so behind the proxy no client
# reads much faster with several connections; a Tidemark gateway over its own data directory
# serves them in parallel, as a real bucket does.
echo "== behind the same proxy, a store that serves GETs in parallel (a Tidemark S3 gateway): the mount's first read and the gateway's cold GET =="
sport=$(free_port); fport=$(free_port); aport=$(free_port)
"$bin" server --data-dir "$work/store" --filer-addr "127.0.0.1:$fport" --admin-addr "127.0.0.1:$aport" \
  --s3-addr "127.0.0.1:$sport" >"$work/store.out" 2>"$work/store.err" &
pids+=($!)
wait_line "$work/store.out" "s3 listening"
store="http://127.0.0.1:$sport"
"$bench" mount --endpoint "$store" --access-key tidemark --secret-key tidemark --size 256M --files 200 --throttle 100
"$bench" gateway --endpoint "$store" --access-key tidemark --secret-key tidemark --size 256M --requests 100 --puts 8 \
  --throttle 100

# Starts a `tidemark server` in the background and sets `filer` to its address. Not run in a
# command substitution: a subshell would keep the pid to itself, and the server would outlive the
# script.
start_server() { # NAME EXTRA...
  local name=$1; shift
  local fport aport
  fport=$(free_port); aport=$(free_port)
  "$bin" server --data-dir "$work/$name" --filer-addr "127.0.0.1:$fport" --admin-addr "127.0.0.1:$aport" --s3-addr off "$@" \
    >"$work/$name.out" 2>"$work/$name.err" &
  pids+=($!)
  wait_line "$work/$name.out" "admin listening"
  filer="127.0.0.1:$fport"
}

echo "== put → visible against moto (S3 → SQS, long polling) =="
start_server s3
bucket="bench-$$"
python3 - "$moto" "$bucket" <<'PY'
import sys, urllib.request
req = urllib.request.Request(f"{sys.argv[1]}/{sys.argv[2]}", method="PUT")
urllib.request.urlopen(req).read()
PY
"$bin" shell --filer "$filer" -c "remote.configure -name=s3 -type=s3 -s3.endpoint=$moto -s3.access_key=testing -s3.secret_key=testing; \
  remote.mount -dir=/mnt/s3 -remote=s3/$bucket; remote.events.enable -dir=/mnt/s3" >/dev/null
"$bench" latency --filer "$filer" --dir /mnt/s3 --puts "$puts"
# 10 a second keeps moto at about a quarter of a core; at 40 it is saturated (one core), which the
# figures then show: docs/BENCHMARKS.md.
for rate in 10 40; do
  echo "== put → visible against moto at a sustained $rate puts a second =="
  "$bench" latency --filer "$filer" --dir /mnt/s3 --puts "$puts" --rate "$rate"
done

echo "== put → visible for a local bucket (filesystem notifications) =="
start_server local --local-bucket "$work/buckets/demo"
wait_line "$work/local.out" "mounted at"
"$bench" latency --filer "$filer" --dir /buckets/demo --puts "$puts"
"$bench" latency --filer "$filer" --dir /buckets/demo --puts "$puts" --rate 40

echo "== reconcile: 100,000 and 1,000,000 objects against the in-process bucket =="
"$bench" reconcile --objects 100000
"$bench" reconcile --objects 1000000
