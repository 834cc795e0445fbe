#!/usr/bin/env bash
# `make test`: the import contracts (lint-imports), ruff, mypy, then the whole suite, against real PostgreSQL and Redis.
#
# Uses the servers at their standard local ports when they answer; otherwise
# starts private ones in a temp dir (installing redis-server with apt-get if
# missing; PostgreSQL 15 with initdb + pg_ctl), so it also passes on a bare
# machine. Pass 1 runs everything against PostgreSQL; pass 2 re-runs the
# dialect-sensitive tests (marker `dialect`; not the slow or multi-process ones) against SQLite.
# Extra arguments go to both pytest passes (e.g. `make test ARGS="-k quota"`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_venv.sh
PY=.venv/bin/python
# The architecture first (pyproject.toml [tool.importlinter]): a broken contract fails the command at once.
echo "== import contracts (lint-imports)"
.venv/bin/lint-imports --no-cache --no-logo
echo "== lint (ruff check) and format (ruff format --check: the engines)"
.venv/bin/ruff check .
.venv/bin/ruff format --check --quiet tuning/engine scheduling/horus core/onnx_models common
echo "== types (mypy: the engines, [tool.mypy] in pyproject.toml)"
.venv/bin/mypy
TMP=$(mktemp -d /tmp/dlopt-test.XXXXXX)
STARTED=()
cleanup() {
  for cmd in "${STARTED[@]:-}"; do [ -n "$cmd" ] && eval "$cmd" >/dev/null 2>&1 || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

port_answers() { $PY - "$1" "$2" <<'PYEOF'
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex((sys.argv[1], int(sys.argv[2]))) == 0 else 1)
PYEOF
}

apt_install() {
  if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else sudo apt-get update -qq >/dev/null && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; fi
}

# --- Redis ----------------------------------------------------------------------
if [ -z "${TEST_REDIS_URL:-}" ]; then
  if port_answers 127.0.0.1 6379 && [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null || $PY -c 'import redis;print(redis.Redis(port=6379).ping() and "PONG")' 2>/dev/null)" = "PONG" ]; then
    export TEST_REDIS_URL=redis://127.0.0.1:6379/15
  else
    command -v redis-server >/dev/null || { echo "Installing redis-server with apt-get..."; apt_install redis-server; }
    redis-server --port 6391 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --dir "$TMP" --pidfile "$TMP/redis.pid" --logfile "$TMP/redis.log"
    STARTED+=("kill \$(cat $TMP/redis.pid)")
    for _ in $(seq 50); do port_answers 127.0.0.1 6391 && break; sleep 0.1; done
    export TEST_REDIS_URL=redis://127.0.0.1:6391/15
  fi
fi
# The fault tests stop and restart a Redis of their own; they need the binary.
command -v redis-server >/dev/null || { echo "Installing redis-server with apt-get..."; apt_install redis-server; }

# --- Chromium for the browser tests (Playwright drives the system browser) ------
command -v chromium >/dev/null || [ -x /usr/bin/chromium ] || { echo "Installing chromium with apt-get..."; apt_install chromium; }

# --- PostgreSQL -----------------------------------------------------------------
if [ -z "${TEST_DATABASE_URL:-}" ]; then
  if port_answers 127.0.0.1 5432 && $PY -c 'import psycopg; psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=3).close()' 2>/dev/null; then
    export TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/dlopt
  else
    PGBIN=$(dirname "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)")
    [ -x "$PGBIN/initdb" ] || { echo "error: PostgreSQL binaries (initdb) not found" >&2; exit 1; }
    PGDATA="$TMP/pg"
    RUNAS=()
    if [ "$(id -u)" = 0 ]; then  # initdb refuses to run as root
      id postgres >/dev/null 2>&1 || useradd -r -M postgres
      chown -R postgres "$TMP"; chmod 755 "$TMP"
      RUNAS=(runuser -u postgres --)
    fi
    "${RUNAS[@]}" "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust -E UTF8 >/dev/null
    "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$PGDATA" -o "-p 5441 -k $TMP -c listen_addresses=127.0.0.1 -c fsync=off" -l "$TMP/pg.log" -w start >/dev/null
    STARTED+=("${RUNAS[*]} $PGBIN/pg_ctl -D $PGDATA -m immediate stop")
    export TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5441/dlopt
  fi
fi

export DLOPT_VAR_DIR="$TMP/var"
export REDIS_URL="$TEST_REDIS_URL"   # the Celery broker of the tests and their workers
export PYTHONUNBUFFERED=1
echo "== pass 1: whole suite on PostgreSQL ($TEST_DATABASE_URL), Redis $TEST_REDIS_URL"
set +e
DATABASE_URL="$TEST_DATABASE_URL" $PY -m pytest "$@"
rc1=$?
# Pass 2 re-runs only the tests marked `dialect` (behaviour that can differ by database: locks,
# constraints, the ledger trigger, migrations, date functions and sums), not every database test.
echo "== pass 2: dialect-sensitive database tests on SQLite"
DATABASE_URL="sqlite:///$TMP/sqlite-test.db" $PY -m pytest -m "dialect and not integration and not slow" -q "$@"
rc2=$?
set -e
# pytest exits 5 when a selection holds no test; an empty pass 2 is not a failure.
[ $rc2 -eq 5 ] && rc2=0
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
  echo "FAILED: pass 1 (PostgreSQL) exit $rc1, pass 2 (SQLite) exit $rc2"; exit 1
fi
echo "OK: both passes green"
