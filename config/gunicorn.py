"""gunicorn settings of the web tier: `gunicorn -c config/gunicorn.py config.wsgi:application`
(docker-compose.yml, scripts/run.sh). Plain Python read by gunicorn's master; no Django here.

Slow clients: gunicorn's default sync worker serves one request at a time and is killed when a request
takes longer than `timeout` (30 s), so one upload at 400 KB/s pinned a whole worker and died at 30 s
(20 MB at most, far from the 200 MB cap), and two such uploads took a 2-worker web tier away. The
threaded worker (gthread) reads each request in a thread of its own: a slow upload holds one thread
(WEB_WORKERS x WEB_THREADS requests in all) and its worker's heartbeat keeps running, so `timeout` no
longer caps how long a request may take; it only catches a worker process that hangs. `graceful_timeout`
(how long a restart lets requests in flight finish) fits the largest upload at the slowest rate the
platform supports: ONNX_MAX_UPLOAD_BYTES at UPLOAD_MIN_BYTES_PER_S. A client that stops sending in the
middle of its body frees its thread after WEB_CLIENT_IDLE_TIMEOUT seconds of silence (gthread reads a body
with no timeout of its own); the request is answered 400. For many slow clients at once, put a buffering
proxy in front (nginx buffers request bodies by default, proxy_request_buffering on) so the web tier only
ever sees whole requests.
"""
import math
import os


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


# The settings' default cap (config/settings.py ONNX_MAX_UPLOAD_BYTES), read from the same variable.
max_upload_bytes = _int("ONNX_MAX_UPLOAD_BYTES", 200 * 1024 * 1024)
min_upload_bytes_per_s = _int("UPLOAD_MIN_BYTES_PER_S", 256 * 1024)  # a slow but usable uplink (2 Mbit/s)
longest_upload_s = math.ceil(max_upload_bytes / min_upload_bytes_per_s)

bind = os.environ.get("WEB_BIND", "0.0.0.0:8000")
worker_class = "gthread"
workers = _int("WEB_WORKERS", 3)
threads = _int("WEB_THREADS", 8)
timeout = _int("WEB_WORKER_TIMEOUT", 120)  # a hung worker process (gthread: not a slow request)
graceful_timeout = _int("WEB_GRACEFUL_TIMEOUT", longest_upload_s + 60)
keepalive = 5
client_idle_timeout = float(os.environ.get("WEB_CLIENT_IDLE_TIMEOUT") or 60)


def pre_request(worker, req):
    """Bound each read of the request body: a stalled client must not hold its thread for good."""
    worker.log.debug("%s %s", req.method, req.path)
    sock = getattr(getattr(req, "unreader", None), "sock", None)
    if sock is not None:
        sock.settimeout(client_idle_timeout)
