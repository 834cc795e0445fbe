#!/usr/bin/env bash
# `make test-fast`: the edit loop. The suite without the integration, browser and slow tests, on a test
# database kept between runs (pytest-django's --reuse-db), and no lint. `make test` stays the gate.
#
# The database is SQLite in var/test-fast/ (no server to start, and the kept file opens at once);
# set DATABASE_URL to run it on PostgreSQL instead. Extra arguments go to pytest, e.g.
#   make test-fast ARGS="tests/core -k quota"
#   make test-fast ARGS=--create-db     # rebuild the kept database (after a migration was edited or removed)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_venv.sh
export DLOPT_VAR_DIR="${DLOPT_VAR_DIR:-$PWD/var/test-fast}"
mkdir -p "$DLOPT_VAR_DIR"
export PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest --reuse-db -q -m "not integration and not browser and not slow" "$@"
