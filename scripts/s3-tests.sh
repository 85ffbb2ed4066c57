#!/usr/bin/env bash
# Runs ceph/s3-tests (the suite S3 implementations test themselves with) against a fresh
# `tidemark server`'s S3 gateway and prints the counts: the yardstick of docs/SEMANTICS.md's
# "The S3 gateway". The suite is not part of this repository: give a checkout kept outside it.
#
#   git clone https://github.com/ceph/s3-tests /tmp/s3-tests    # once, anywhere outside the repo
#   scripts/s3-tests.sh /tmp/s3-tests [PYTEST ARGS...]          # e.g. -k test_bucket_list
#
# It builds Tidemark, makes a Python virtualenv with the suite's requirements (in the checkout's
# own directory, never in this repository), starts the server on free ports with the suite's
# three identities (main, alt, tenant), runs s3tests/functional/test_s3.py and writes a JUnit
# report beside the counts. The server is stopped on exit, even on failure.
set -euo pipefail
checkout="$(cd "${1:?usage: scripts/s3-tests.sh S3_TESTS_CHECKOUT [PYTEST ARGS...]}" && pwd)"
shift
cd "$(dirname "$0")/.."
repo="$(pwd)"
case "$checkout/" in
  "$repo"/*) echo "s3-tests: keep the checkout outside this repository" >&2; exit 2 ;;
esac

cargo build -q -p tidemark
bin="$repo/target/debug/tidemark"
work=$(mktemp -d -t tidemark-s3tests-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; }
trap cleanup EXIT

venv="$checkout/.venv-tidemark"
if [ ! -x "$venv/bin/pytest" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$checkout/requirements.txt"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
fport=$(free_port); aport=$(free_port); sport=$(free_port)
# The encryption keyring: SSE-S3's key and the two SSE-KMS key ids the suite names by default
# (testkey-1, testkey-2), fresh for the run.
key() { python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())'; }
(umask 077; printf 'aws/s3=%s\ntestkey-1=%s\ntestkey-2=%s\n' "$(key)" "$(key)" "$(key)" >"$work/sse-keys")
# Lifecycle days as 4 s (the suite's lc_debug_interval below), as RGW's rgw_lc_debug_interval.
TIDEMARK_S3_LIFECYCLE_DAY_SECS=4 "$bin" server --data-dir "$work/data" --filer-addr "127.0.0.1:$fport" --admin-addr "127.0.0.1:$aport" \
  --s3-addr "127.0.0.1:$sport" --sse-keys "$work/sse-keys" >"$work/server.out" 2>"$work/server.err" &
pid=$!
for _ in $(seq 1 300); do grep -q "admin listening" "$work/server.out" 2>/dev/null && break; sleep 0.1; done

# The suite's identities (its sample configuration's keys).
main_ak=0555b35654ad1656d804 main_sk='h7GhxuBLTrlhVUyxSPUKUV8r/2EI4ngqJxD7iBdBYLhwluN30JaT3Q=='
alt_ak=NOPQRSTUVWXYZABCDEFG alt_sk=nopqrstuvwxyzabcdefghijklmnabcdefghijklm
tenant_ak=HIJKLMNOPQRSTUVWXYZA tenant_sk=opqrstuvwxyzabcdefghijklmnopqrstuvwxyzab
"$bin" shell --filer "127.0.0.1:$fport" -c "\
  s3.configure -user=main -access_key=$main_ak -secret_key=$main_sk -actions=Read,Write,List,Admin -apply; \
  s3.configure -user=alt -access_key=$alt_ak -secret_key=$alt_sk -actions=Read,Write,List,Admin -apply; \
  s3.configure -user=tenant -access_key=$tenant_ak -secret_key=$tenant_sk -actions=Read,Write,List,Admin -apply" >/dev/null

cat >"$work/s3tests.conf" <<EOF
[DEFAULT]
host = 127.0.0.1
port = $sport
is_secure = False
ssl_verify = False

[fixtures]
bucket prefix = tm-{random}-
iam name prefix = s3-tests-
iam path prefix = /s3-tests/

[s3 main]
display_name = main
user_id = main
email = main@example.com
api_name = default
lc_debug_interval = 4
access_key = $main_ak
secret_key = $main_sk

[s3 alt]
display_name = alt
user_id = alt
email = alt@example.com
access_key = $alt_ak
secret_key = $alt_sk

[s3 tenant]
display_name = tenant
user_id = tenant
access_key = $tenant_ak
secret_key = $tenant_sk
email = tenant@example.com
tenant = testx

[iam]
email = s3@example.com
user_id = iam
access_key = ABCDEFGHIJKLMNOPQRST
secret_key = abcdefghijklmnopqrstuvwxyzabcdefghijklmn
display_name = iam

[iam root]
access_key = AAAAAAAAAAAAAAAAAAaa
secret_key = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
user_id = RGW11111111111111111
email = account1@example.com

[iam alt root]
access_key = BBBBBBBBBBBBBBBBBBbb
secret_key = bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
user_id = RGW22222222222222222
email = account2@example.com
EOF

report="$work/s3-tests.xml"
echo "s3-tests: running against 127.0.0.1:$sport (server log: $work/server.err)"
(cd "$checkout" && S3TEST_CONF="$work/s3tests.conf" "$venv/bin/pytest" -q -p no:cacheprovider \
  --junitxml="$report" s3tests/functional/test_s3.py "$@" >"$work/pytest.log" 2>&1) || true
tail -n 3 "$work/pytest.log"
python3 - "$report" <<'PY'
import collections, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
counts = collections.Counter()
by_area = collections.defaultdict(collections.Counter)
for case in root.iter("testcase"):
    outcome = "passed"
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}[tag]
    counts[outcome] += 1
    name = case.get("name", "")
    area = name.split("_")[1] if name.startswith("test_") and "_" in name[5:] else name
    by_area[area][outcome] += 1
total = sum(counts.values())
print(f"s3-tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped of {total}")
for area, c in sorted(by_area.items(), key=lambda kv: -sum(kv[1].values()))[:25]:
    print(f"  {area:<20} passed {c['passed']:>4}  failed {c['failed']:>4}  skipped {c['skipped']:>3}")
PY
echo "s3-tests: report $report, pytest output $work/pytest.log"
