"""Settings, all from environment variables (django-environ).

With no environment set, the platform runs on embedded defaults: SQLite and a
SQLite-backed Celery broker under ./var, so `make run` needs no server. Set
DATABASE_URL and REDIS_URL for the deployment (PostgreSQL + Redis), and
DJANGO_SECURE=1 for production hardening (`check --deploy` is clean then).
"""
from __future__ import annotations

import socket
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False) if (BASE_DIR / ".env").exists() else None

VAR_DIR = Path(env.str("DLOPT_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECURE = env.bool("DJANGO_SECURE", default=False)
_DEV_SECRET = "dev-insecure-secret-key-change-me-0123456789-abcdefghijklmnopqrstuvwxyz"
# Keys that are (or were) published in this repository: anyone can forge sessions signed with them.
PUBLISHED_SECRET_KEYS = frozenset({
    _DEV_SECRET,
    "change-me-in-production-please-0123456789abcdef",  # docker-compose.yml's default until issue 11
})


def _secret_key() -> str:
    """The rule: DJANGO_SECRET_KEY set to a published key is refused in any mode; DJANGO_SECURE=1
    needs it set, 50+ characters, 5+ distinct (Django's own bar, security.W009). Unset with
    DJANGO_SECURE=0 (`make run`, tests) = the dev key."""
    key = env.str("DJANGO_SECRET_KEY", default="")
    if key in PUBLISHED_SECRET_KEYS:
        raise environ.ImproperlyConfigured(
            "DJANGO_SECRET_KEY is a key published in the dlopt repository; generate your own, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))'")
    if SECURE and (len(key) < 50 or len(set(key)) < 5):
        raise environ.ImproperlyConfigured(
            "DJANGO_SECURE=1 requires DJANGO_SECRET_KEY to be set to a random string of 50+ characters, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))'")
    return key or _DEV_SECRET


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "config.admin.PlatformAdminConfig",  # django.contrib.admin, with its login guarded (config/admin.py)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_results",
    "django_celery_beat",
    "core",
    "tuning",
    "scheduling",
    "recordcache",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.middleware.ContentSecurityPolicyMiddleware",  # above WhiteNoise: static files get it too
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "config.middleware.RequestBodyLimitMiddleware",  # before the CSRF check reads (and spools) the body
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "core.outages.ServiceUnavailableMiddleware",  # a full disk or a backing service down: 503, not 500
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}")}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Web server, Celery workers and tuning processes share one file: wait on
    # locks instead of failing, and use WAL so readers never block the writer.
    # IMMEDIATE transactions take the write lock at BEGIN, where the busy timeout
    # applies; a deferred one that reads and then writes fails at once with
    # "database is locked" when another writer holds the lock (seen under load).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE",
         "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}
    )
    # Tests on a file too, as the deployment runs: Django's default in-memory test database is in
    # shared-cache mode, whose table locks fail a reader at once ("database table is locked") while a
    # live-server test's worker thread writes, instead of waiting like WAL readers.
    DATABASES["default"].setdefault("TEST", {}).setdefault("NAME", f"{DATABASES['default']['NAME']}-test")
else:
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("DJANGO_STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"
        if SECURE
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every request otherwise
MEDIA_ROOT = Path(env.str("DJANGO_MEDIA_ROOT", default=str(VAR_DIR / "media")))
MEDIA_URL = "media/"

# Reverse proxies in front of the web server that append the client's address to X-Forwarded-For. 0: trust
# no such header and use the connection's address (a client can write any X-Forwarded-For it likes); the
# compose deployment, behind its TLS proxy, sets 1. Every rate limit reads the address through
# core.client_address.
NUM_PROXIES = env.int("NUM_PROXIES", default=0)
# Password guessing per account (core.login_guard): this many failures for one user name within the window
# lock that name for LOGIN_LOCKOUT_SECONDS, whatever the client address.
AUTHENTICATION_BACKENDS = ["core.authentication.LockoutModelBackend"]
LOGIN_LOCKOUT_FAILURES = env.int("LOGIN_LOCKOUT_FAILURES", default=10)
LOGIN_LOCKOUT_WINDOW_SECONDS = env.int("LOGIN_LOCKOUT_WINDOW_SECONDS", default=15 * 60)
LOGIN_LOCKOUT_SECONDS = env.int("LOGIN_LOCKOUT_SECONDS", default=15 * 60)

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# --- Security (DJANGO_SECURE=1 in production) -------------------------------
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the dashboard's fetch() reads it for POSTs
X_FRAME_OPTIONS = "DENY"
# Scripts from this origin only (no inline script, no eval), no plugins, no framing, forms post here only.
# Styles allow inline: plotly.js writes <style> rules and the templates set bar widths in style attributes.
CONTENT_SECURITY_POLICY = env.str("DJANGO_CONTENT_SECURITY_POLICY", default="; ".join([
    "default-src 'self'", "script-src 'self'", "style-src 'self' 'unsafe-inline'", "img-src 'self' data: blob:",
    "font-src 'self' data:", "connect-src 'self'", "object-src 'none'", "base-uri 'self'",
    "frame-ancestors 'none'", "form-action 'self'",
]))
SECURE_CONTENT_TYPE_NOSNIFF = True
if SECURE:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# --- REST API ------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "core.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "core.api.pagination.StandardPagination",
    "PAGE_SIZE": 50,
    # JSON via orjson, and django-filter skipped on requests with no filter parameter (core/api/*.py).
    "DEFAULT_RENDERER_CLASSES": [
        "core.api.renderers.OrjsonRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "core.api.fast.QuickFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.api.errors.exception_handler",
    # Every API request counts against "user"; uploads (models, traces, records; API and dashboard alike)
    # and token creation also against their own scope (core/api/throttles.py), sign-ins against "login" per
    # client address (core/login_guard.py). Over the rate: 429 with Retry-After.
    "DEFAULT_THROTTLE_CLASSES": ["core.api.throttles.UserThrottle"],
    "NUM_PROXIES": NUM_PROXIES,  # DRF's own reading of X-Forwarded-For agrees with core.client_address
    "DEFAULT_THROTTLE_RATES": {
        "user": env.str("API_THROTTLE_USER", default="100000/hour"),
        "uploads": env.str("API_THROTTLE_UPLOADS", default="60/hour"),
        "tokens": env.str("API_THROTTLE_TOKENS", default="20/hour"),
        "login": env.str("API_THROTTLE_LOGIN", default="10/minute"),
    },
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
API_DOCS_PUBLIC = env.bool("API_DOCS_PUBLIC", default=False)  # 1 = /api/schema/ and /api/docs/ without login
SPECTACULAR_SETTINGS = {
    "TITLE": "dlopt API",
    "DESCRIPTION": "Upload ONNX models, tune them with TVM (DOPpler + Trimmer), place GPU jobs with Horus. "
    "Authenticate with `Authorization: Token <key>` (create keys at /api/tokens/) or a session.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # The schema maps every endpoint: logged-in users (session or token) only, unless API_DOCS_PUBLIC=1.
    "SERVE_PERMISSIONS": ["core.api.permissions.ApiDocsAccess"],
    # The docs page loads Swagger UI from our own static files, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # every operation documents its 400/401/403/404/409/429 with the one error body (core/schema.py)
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "core.schema.add_error_responses"],
    # three models have a `kind`: name each enum after its model, not after a hash of its values
    "ENUM_NAME_OVERRIDES": {
        "GpuJobKindEnum": "scheduling.models.GpuJob.Kind",
        "TraceUploadKindEnum": "scheduling.models.TraceUpload.Kind",
        "UsageChargeKindEnum": "core.models.UsageCharge.Kind",
    },
}

# Throttle and sign-in lockout counts, figure bodies: Redis in deployment so every web worker shares them.
# While that Redis is unreachable the cache answers from a per-process local cache (core/cache.py): the
# limits then count per web process, and nothing answers 500 for it.
_CACHE_URL = env.str("DJANGO_CACHE_URL", default="")
CACHES = {"default": {"BACKEND": "core.cache.DegradingRedisCache", "LOCATION": _CACHE_URL,
                      "OUTAGE_RETRY_S": env.float("DJANGO_CACHE_OUTAGE_RETRY_S", default=5.0)}
          if _CACHE_URL else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Celery --------------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")
CELERY_BROKER_URL = env.str(
    "CELERY_BROKER_URL",
    default=REDIS_URL or f"sqla+sqlite:///{VAR_DIR / 'celery-broker.sqlite3'}",
)
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default="django-db")
CELERY_RESULT_EXTENDED = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_TRACK_STARTED = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # reconnect after a broker restart, forever
# Routes match task *names* (tasks are named "<app>.<action>").
CELERY_TASK_ROUTES = {
    "tuning.execute_run": {"queue": "tuning"},
    "tuning.recover_stale_runs": {"queue": "tuning"},
    "tuning.settle_ended_runs": {"queue": "tuning"},  # where the engine's user owns the work dirs
    "tuning.settle_run_database": {"queue": "tuning"},
    "scheduling.heartbeat": {"queue": "telemetry"},
    # Simulations have their own queue and worker, so a long one never delays tuning or placement.
    "scheduling.run_simulation": {"queue": "simulations"},
}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_ALWAYS_EAGER = False

# --- Platform ------------------------------------------------------------------
NODE_NAME = env.str("DLOPT_NODE_NAME", default=socket.gethostname().split(".")[0])
ONNX_MAX_UPLOAD_BYTES = env.int("ONNX_MAX_UPLOAD_BYTES", default=200 * 1024 * 1024)
# Uploaded cluster traces (CSV/JSON, gzipped or not): the cap on the file and on what it unpacks to.
SCHEDULING_MAX_TRACE_BYTES = env.int("SCHEDULING_MAX_TRACE_BYTES", default=50 * 1024 * 1024)
ONNX_MAX_GFLOPS = env.float("ONNX_MAX_GFLOPS", default=500.0)
# Memory caps checked from shape inference, before anything is compiled: elements in any one
# tensor (2**28 = 1 GiB of float32) and bytes of all intermediate tensors together.
ONNX_MAX_TENSOR_ELEMENTS = env.int("ONNX_MAX_TENSOR_ELEMENTS", default=2**28)
ONNX_MAX_ACTIVATION_BYTES = env.int("ONNX_MAX_ACTIVATION_BYTES", default=8 * 1024**3)
# Uploads larger than this are validated by a Celery task (the upload answers 202, state "validating");
# smaller ones inline (201 or 400).
ONNX_ASYNC_VALIDATION_BYTES = env.int("ONNX_ASYNC_VALIDATION_BYTES", default=4 * 1024 * 1024)
ONNX_COUNT_TUNING_TASKS = env.bool("ONNX_COUNT_TUNING_TASKS", default=True)
# What names a model's tuning tasks (a dotted path, resolved when a model is validated): the tuning
# engine's, chosen here so that core imports no tuning code. Empty: TVM only checks the import.
ONNX_TASK_COUNTER = env.str("ONNX_TASK_COUNTER", default="tuning.engine.compile.pipeline.count_tuning_tasks")
# Every upload (ONNX validation with TVM's import and task extraction, cluster-trace parsing) is parsed
# in a short-lived child process (common.sandbox), never in a web or Celery worker: its address space
# (MB), CPU seconds and wall-clock seconds are capped; a child stopped at a limit refuses the upload.
# Inline uploads (the web request) get UPLOAD_SANDBOX_WALL_S, below gunicorn's 30 s worker timeout;
# the Celery validation of large models gets UPLOAD_SANDBOX_ASYNC_WALL_S. UPLOAD_SANDBOX_PREEXEC: a
# "module:function" the child calls after setting its limits, before reading the upload: by default it
# becomes the sandbox account (common.privileges, DLOPT_SANDBOX_USER) where this process may switch
# users; empty: none.
UPLOAD_SANDBOX_MEMORY_MB = env.int("UPLOAD_SANDBOX_MEMORY_MB", default=3072)
UPLOAD_SANDBOX_CPU_S = env.int("UPLOAD_SANDBOX_CPU_S", default=300)
UPLOAD_SANDBOX_WALL_S = env.float("UPLOAD_SANDBOX_WALL_S", default=25.0)
UPLOAD_SANDBOX_ASYNC_WALL_S = env.float("UPLOAD_SANDBOX_ASYNC_WALL_S", default=600.0)
UPLOAD_SANDBOX_PREEXEC = env.str("UPLOAD_SANDBOX_PREEXEC", default="common.privileges:drop_privileges")
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024  # larger uploads stream to a temp file
# Larger uploads are spooled here (under var/, the data volume, not /tmp). A file not written for
# UPLOAD_TEMP_MAX_AGE_S is a killed request's leftover, removed at web start and by beat
# (core/services/upload_temp.py).
FILE_UPLOAD_TEMP_DIR = env.str("DJANGO_FILE_UPLOAD_TEMP_DIR", default=str(VAR_DIR / "upload-tmp"))
Path(FILE_UPLOAD_TEMP_DIR).mkdir(parents=True, exist_ok=True)
UPLOAD_TEMP_MAX_AGE_S = env.float("UPLOAD_TEMP_MAX_AGE_S", default=3600.0)
DEFAULT_TUNING_TARGET = {"kind": "llvm", "num-cores": env.int("DLOPT_TUNING_CORES", default=2)}
# A running run whose executor sent no heartbeat for this long is presumed dead
# (its worker was killed) and re-enqueued by tuning.recover_stale_runs.
TUNING_STALE_AFTER_S = env.float("TUNING_STALE_AFTER_S", default=120.0)
# A run whose executor died this many times (each re-queued by recovery) is failed, not retried:
# a model that kills the worker would otherwise kill every worker, forever.
TUNING_MAX_EXECUTOR_LOSSES = env.int("TUNING_MAX_EXECUTOR_LOSSES", default=3)
# The sweep (tuning.settle_ended_runs, each minute) commits to the TVM database of a run that ended in
# the last WINDOW seconds the stored results its killed engine left out; at most BATCH runs a sweep
# (each one opens TVM), newest first. A settled run is skipped without TVM (a marker in its work dir).
TUNING_SETTLE_SWEEP_WINDOW_S = env.float("TUNING_SETTLE_SWEEP_WINDOW_S", default=6 * 3600.0)
TUNING_SETTLE_SWEEP_BATCH = env.int("TUNING_SETTLE_SWEEP_BATCH", default=5)
# the platform-wide tuning-record cache (recordcache): runs look their tasks up and publish their serial re-measures
RECORD_CACHE_ENABLED = env.bool("RECORD_CACHE_ENABLED", default=True)
# Remote (measure_queues) measurement: how long one measurement may take once a worker has started it, and
# how long it may wait in its queue for a worker; past either it is an infrastructure failure.
TUNING_MEASURE_TIMEOUT_S = env.float("TUNING_MEASURE_TIMEOUT_S", default=600.0)
TUNING_MEASURE_QUEUE_TIMEOUT_S = env.float("TUNING_MEASURE_QUEUE_TIMEOUT_S", default=3600.0)
# Soft time limit of one execution of a tuning run (tuning.execute_run); past it the run fails, saying so.
TUNING_RUN_TIME_LIMIT_S = env.float("TUNING_RUN_TIME_LIMIT_S", default=11 * 3600.0)
CELERY_BEAT_SCHEDULE = {
    "recover-stale-tuning-runs": {"task": "tuning.recover_stale_runs", "schedule": 60.0},
    "settle-ended-tuning-runs": {"task": "tuning.settle_ended_runs", "schedule": 60.0},
    "resend-lost-webhooks": {"task": "core.resend_lost_webhooks", "schedule": 300.0},
    "clean-upload-temp": {"task": "core.clean_upload_temp", "schedule": 900.0},
    "gpu-heartbeat": {"task": "scheduling.heartbeat", "schedule": env.float("SCHEDULING_HEARTBEAT_S", default=15.0)},
}
# GPU scheduling (Horus): placement policy and liveness windows.
SCHEDULING_POLICY = env.str("SCHEDULING_POLICY", default="horus")
SCHEDULING_NODE_STALE_S = env.float("SCHEDULING_NODE_STALE_S", default=180.0)
SCHEDULING_TELEMETRY_FRESH_S = env.float("SCHEDULING_TELEMETRY_FRESH_S", default=120.0)
SCHEDULING_TELEMETRY_RETENTION_DAYS = env.int("SCHEDULING_TELEMETRY_RETENTION_DAYS", default=7)
SCHEDULING_DEFAULT_JOB_ESTIMATE_S = env.float("SCHEDULING_DEFAULT_JOB_ESTIMATE_S", default=600.0)
# The longest GPU time a job may declare (duration_estimate_s); a job is stopped when it reaches its own.
SCHEDULING_MAX_JOB_DURATION_S = env.float("SCHEDULING_MAX_JOB_DURATION_S", default=24 * 3600.0)
# Per-GPU job slots a GPU worker holds while it runs a job (flock'd files, at most 3 per GPU): node-local.
SCHEDULING_GPU_SLOTS_DIR = env.str("SCHEDULING_GPU_SLOTS_DIR", default=str(VAR_DIR / "gpu-slots"))
# Kubernetes scheduler extender (docs/scheduling.md): the Bearer token its callers present ("" = the
# endpoints answer 503), how long a bound pod counts as load without a release call, and the API server
# it binds pods through ("" = in-cluster: KUBERNETES_SERVICE_HOST with the service account's token and CA).
SCHEDULER_EXTENDER_TOKEN = env.str("SCHEDULER_EXTENDER_TOKEN", default="")
# A pod may name only models of the team whose slug is its namespace (0: any registered model).
SCHEDULER_EXTENDER_TEAM_NAMESPACES = env.bool("SCHEDULER_EXTENDER_TEAM_NAMESPACES", default=True)
SCHEDULER_EXTENDER_BINDING_TTL_S = env.float("SCHEDULER_EXTENDER_BINDING_TTL_S", default=24 * 3600.0)
SCHEDULER_EXTENDER_KUBE_API_URL = env.str("SCHEDULER_EXTENDER_KUBE_API_URL", default="")
SCHEDULER_EXTENDER_KUBE_TOKEN_FILE = env.str("SCHEDULER_EXTENDER_KUBE_TOKEN_FILE",
                                             default="/var/run/secrets/kubernetes.io/serviceaccount/token")
SCHEDULER_EXTENDER_KUBE_CA_FILE = env.str("SCHEDULER_EXTENDER_KUBE_CA_FILE",
                                          default="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")

# --- Celery time limits (after the durations they must cover) ---------------------------
# Time limits per queue, as (soft, hard) seconds: a message gets the limits of the queue it is published
# to (config/celery.py), unless its sender set its own. The soft limit raises SoftTimeLimitExceeded in
# the task, so its service settles the row (a run or a job fails with the reason); the hard one, a
# grace period later, kills the worker child. Patterns are fnmatch patterns, the first match wins.
_TIME_LIMIT_GRACE_S = env.float("CELERY_TIME_LIMIT_GRACE_S", default=300.0)


def _limits(env_name: str, soft_default: float) -> tuple[float, float]:
    soft = env.float(env_name, default=soft_default)
    return soft, soft + _TIME_LIMIT_GRACE_S


CELERY_QUEUE_TIME_LIMITS = {
    "telemetry": _limits("CELERY_TELEMETRY_SOFT_TIME_LIMIT_S", 120.0),       # a heartbeat, a sweep
    "tuning": _limits("CELERY_TUNING_SOFT_TIME_LIMIT_S", 12 * 3600.0),        # a whole tuning run
    "simulations": _limits("CELERY_SIMULATIONS_SOFT_TIME_LIMIT_S", 2 * 3600.0),
    # measure.<node>.cpu: candidate measurements (each TUNING_MEASURE_TIMEOUT_S at most); measure.<node>.gpu<i>:
    # those and placed GPU jobs, which stop themselves at their declared duration (SCHEDULING_MAX_JOB_DURATION_S).
    "measure.*.cpu": _limits("CELERY_MEASURE_SOFT_TIME_LIMIT_S", max(3600.0, TUNING_MEASURE_TIMEOUT_S + 600.0)),
    "measure.*": _limits("CELERY_GPU_SOFT_TIME_LIMIT_S",
                         max(SCHEDULING_MAX_JOB_DURATION_S, TUNING_MEASURE_TIMEOUT_S) + 600.0),
    "*": _limits("CELERY_DEFAULT_SOFT_TIME_LIMIT_S", 3600.0),                # default: validation, placement
}
# Longer than the longest task (every queue's hard limit, and at least 12 h), so Redis does not re-deliver
# a message that a live worker is still executing.
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=int(max(
        12 * 3600, max(hard for _, hard in CELERY_QUEUE_TIME_LIMITS.values()) + 600)))}
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else {}
)

# Energy model used where no meter exists (labeled "modeled" everywhere it shows).
ENERGY_CPU_WATTS_PER_CORE = env.float("ENERGY_CPU_WATTS_PER_CORE", default=10.0)
ENERGY_GPU_BOARD_WATTS = env.float("ENERGY_GPU_BOARD_WATTS", default=300.0)
ENERGY_GRID_INTENSITY_G_PER_KWH = env.float("ENERGY_GRID_INTENSITY_G_PER_KWH", default=400.0)
# Used to refuse a run that would exceed the energy quota before the team has history.
ENERGY_JOULES_PER_TRIAL_ESTIMATE = env.float("ENERGY_JOULES_PER_TRIAL_ESTIMATE", default=15.0)

# Processes that hold these settings' secrets are non-dumpable: the sandboxes (same user) cannot read
# their /proc/<pid>/environ or memory, nor ptrace them. DLOPT_ALLOW_DUMPABLE=1 for debugging (py-spy).
if not env.bool("DLOPT_ALLOW_DUMPABLE", default=False):
    from tuning.engine.process.sandbox import protect_secrets

    protect_secrets()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("DJANGO_LOG_LEVEL", default="INFO")},
    "loggers": {
        "tvm.s_tir.meta_schedule": {"level": "WARNING"},
        "django.db.backends": {"level": "WARNING"},
    },
}

# Team webhooks (core.services.webhooks): https only, to public addresses; plain http only to these hosts.
WEBHOOK_HTTP_HOSTS = env.list("WEBHOOK_HTTP_HOSTS", default=[])
# True lets webhooks reach private and loopback addresses (tests, a receiver inside a private network).
WEBHOOK_ALLOW_PRIVATE_ADDRESSES = env.bool("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", default=False)
WEBHOOK_MAX_ATTEMPTS = env.int("WEBHOOK_MAX_ATTEMPTS", default=6)
WEBHOOK_RETRY_BASE_S = env.float("WEBHOOK_RETRY_BASE_S", default=30.0)  # then 60, 120, 240, 480 s
WEBHOOK_TIMEOUT_S = env.float("WEBHOOK_TIMEOUT_S", default=10.0)
# A pending delivery whose next attempt is this overdue lost its message; beat sends it again.
WEBHOOK_LOST_AFTER_S = env.float("WEBHOOK_LOST_AFTER_S", default=600.0)
