#!/usr/bin/env bash
# `make run`: install, migrate, create the demo user/team/zoo, start a Celery worker (with beat) and the web server.
# Embedded defaults: SQLite + a SQLite-backed Celery broker under ./var; set DATABASE_URL/REDIS_URL for servers.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_venv.sh
PY=.venv/bin/python
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
# Nothing the platform writes may be writable by other users: the sandboxes (candidate builds and
# measurements, upload parsers) run as one when this runs as root (common/privileges.py).
umask 022
if [ "$(id -u)" = 0 ] && [ -z "${DLOPT_SANDBOX_USER:-}" ] && ! id dlopt-sandbox >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin dlopt-sandbox \
    || echo "warning: could not create the dlopt-sandbox account; sandboxes run as nobody" >&2
fi
mkdir -p var/log var/media
chmod -R o-w var
$PY manage.py migrate --noinput
# The SQLite database and broker (with their -wal/-shm files, which copy the mode): this user's only.
chmod 600 var/*.sqlite3* 2>/dev/null || true
$PY manage.py collectstatic --noinput >/dev/null
$PY manage.py bootstrap_demo
$PY manage.py clean_upload_temp >/dev/null  # temp files of uploads a killed web worker left behind
NODE=$($PY -c 'import socket; print(socket.gethostname().split(".")[0])')
QUEUES=${WORKER_QUEUES:-default,tuning,telemetry,measure.$NODE.cpu}
# The worker runs celery beat too (-B): stale-run recovery and the other periodic tasks (scripts/worker.sh).
WORKER_QUEUES="$QUEUES" scripts/worker.sh >var/log/worker.log 2>&1 &
WORKER_PID=$!
# Trace simulations run on their own queue and worker (one slot), so they never delay tuning.
.venv/bin/celery -A config worker -Q "${SIMULATION_QUEUES:-simulations}" --concurrency 1 \
  --hostname "sim@$NODE" --loglevel INFO >var/log/simulation-worker.log 2>&1 &
SIM_WORKER_PID=$!
# On a GPU host, a second worker serves each GPU's queue (placed GPU jobs, GPU measurements), with three
# slots per GPU: the jobs Horus co-locates on a GPU (at most 3) run together.
GPUS=$($PY -c 'import pynvml as n
try:
    n.nvmlInit(); print(n.nvmlDeviceGetCount())
except Exception:
    print(0)' 2>/dev/null || echo 0)
GPU_WORKER_PID=""
if [ "${GPUS:-0}" -gt 0 ]; then
  GPU_QUEUES=$(seq -s, -f "measure.$NODE.gpu%g" 0 $((GPUS - 1)))
  .venv/bin/celery -A config worker -Q "$GPU_QUEUES" --concurrency $((3 * GPUS)) --pool prefork \
    --hostname "gpu@$NODE" --loglevel INFO >var/log/gpu-worker.log 2>&1 &
  GPU_WORKER_PID=$!
  QUEUES="$QUEUES; GPU worker: $GPU_QUEUES (var/log/gpu-worker.log)"
fi
trap 'kill $WORKER_PID $SIM_WORKER_PID $GPU_WORKER_PID 2>/dev/null
      wait $WORKER_PID $SIM_WORKER_PID $GPU_WORKER_PID 2>/dev/null' EXIT INT TERM
for _ in $(seq 60); do grep -q " ready." var/log/worker.log 2>/dev/null && break; sleep 0.5
  kill -0 $WORKER_PID 2>/dev/null || { echo "error: the Celery worker exited at start:" >&2; tail -20 var/log/worker.log >&2; exit 1; }
done
chmod 600 var/*.sqlite3* 2>/dev/null || true  # the broker's file, made by the worker just now
cat <<MSG

  dlopt is up.
    Dashboard:  http://$HOST:$PORT/        (login: demo / demo-password)
    API docs:   http://$HOST:$PORT/api/docs/
    Admin:      http://$HOST:$PORT/admin/
    Worker log: var/log/worker.log (queues: $QUEUES)
    Simulations: var/log/simulation-worker.log (queue: ${SIMULATION_QUEUES:-simulations})
  Ctrl-C stops the web server and the worker.

MSG
# Threaded workers (config/gunicorn.py): slow uploads hold a thread each, not a whole worker.
WEB_WORKERS=${WEB_WORKERS:-2} .venv/bin/gunicorn -c config/gunicorn.py config.wsgi:application \
  --bind "$HOST:$PORT" --access-logfile var/log/access.log
