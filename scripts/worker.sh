#!/usr/bin/env bash
# The Celery worker of `make run` (the embedded deployment), also what tests start: it serves the default,
# tuning, telemetry and this node's CPU measurement queues and runs celery beat inside it (-B), so the
# periodic tasks (stale-run recovery, GPU heartbeat) run without a separate beat process. Its schedule is
# django-celery-beat's DatabaseScheduler (CELERY_BEAT_SCHEDULER), in the platform database.
# The embedded beat dies with its worker (even a SIGKILLed one), and every beat holds
# $DLOPT_VAR_DIR/celerybeat.lock for its life (config/celery.py): a second -B on this host waits and takes
# over when the first ends, so there is one beat at a time. Across hosts, run beat on one of them only
# (start the other workers with WORKER_BEAT=0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
NODE=${DLOPT_NODE_NAME:-$($PY -c 'import socket; print(socket.gethostname().split(".")[0])')}
QUEUES=${WORKER_QUEUES:-default,tuning,telemetry,measure.$NODE.cpu}
BEAT=()
[ "${WORKER_BEAT:-1}" = "1" ] && BEAT=(-B)
exec "$PY" -m celery -A config worker "${BEAT[@]}" -Q "$QUEUES" --concurrency "${WORKER_CONCURRENCY:-2}" \
  --hostname "${WORKER_HOSTNAME:-cpu@$NODE}" --loglevel INFO
