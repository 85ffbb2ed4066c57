# Sourced by scripts/test.sh and scripts/bench.sh: `start_postgres [FSYNC]` starts a throwaway
# PostgreSQL cluster in a new directory under the system's temporary directory (where the
# postgres user can reach it; `pg_dir`) (initdb, 127.0.0.1 only, a free port; fsync off unless FSYNC=on: the
# tests need nothing to survive a machine crash, a benchmark compares like with like), exports TIDEMARK_TEST_POSTGRES=postgres://postgres@127.0.0.1:PORT/postgres,
# and defines `stop_postgres` (immediate shutdown, the directory removed). As root it runs the server as
# the postgres user, because the server refuses to run as root.
# Needs free_port, defined by the caller.

stop_postgres() { :; }

start_postgres() { # [FSYNC]
  local fsync=${1:-off} dir bin port
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$bin" ] || { echo "PostgreSQL is not installed: run ./scripts/setup.sh" >&2; return 1; }
  pg_as=()
  dir=$(mktemp -d -t tidemark-pg-XXXXXX)
  if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$dir"; pg_as=(runuser -u postgres --); fi
  "${pg_as[@]}" "$bin/initdb" -A trust -U postgres -E UTF8 --locale=C -D "$dir/data" >"$dir/initdb.log" 2>&1 \
    || { echo "initdb failed; its log:" >&2; cat "$dir/initdb.log" >&2; return 1; }
  port=$(free_port)
  "${pg_as[@]}" "$bin/pg_ctl" -D "$dir/data" -w -t 60 -l "$dir/server.log" \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=$fsync -c max_connections=300" start >/dev/null \
    || { echo "PostgreSQL did not start; its log:" >&2; cat "$dir/server.log" >&2; return 1; }
  pg_bin=$bin pg_dir=$dir
  stop_postgres() { "${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate -w stop >/dev/null 2>&1 || true; rm -rf "$pg_dir"; }
  export TIDEMARK_TEST_POSTGRES="postgres://postgres@127.0.0.1:$port/postgres"
}
