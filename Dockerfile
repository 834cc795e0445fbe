FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# g++ is needed by TVM to link built candidates (.so) on builder hosts.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml ./
COPY . .
RUN pip install --upgrade pip && pip install .
# dlopt runs the web and worker processes; dlopt-sandbox (no home, no shell, owns nothing) runs what they
# start on users' input: candidate builds and measurements, upload parsers (common/privileges.py).
RUN useradd -m -u 1000 dlopt \
 && useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin dlopt-sandbox \
 && mkdir -p /data/media /data/var && chown dlopt:dlopt /data/media /data/var && chmod 0755 /data /data/media /data/var
ENV DLOPT_SANDBOX_USER=dlopt-sandbox
USER dlopt
EXPOSE 8000
# as root (compose's web and workers): become dlopt with only the capabilities the sandboxes need to switch users
ENTRYPOINT ["/app/scripts/entrypoint.sh"]
CMD ["gunicorn", "-c", "config/gunicorn.py", "config.wsgi:application"]
