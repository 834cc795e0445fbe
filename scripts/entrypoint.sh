#!/bin/sh
# The image's entrypoint. A container started as root (the compose services that start sandboxes) becomes
# the app user at once, keeping only CAP_SETUID, CAP_SETGID and CAP_CHOWN as ambient capabilities: the
# sandboxes it starts (candidate builds and measurements, upload parsers) use them to switch to the sandbox
# account, then drop every capability (common/privileges.py). Started as any other user: runs as is.
set -eu
if [ "$(id -u)" = "0" ]; then
  exec setpriv --reuid="${DLOPT_APP_USER:-dlopt}" --regid="${DLOPT_APP_USER:-dlopt}" --init-groups \
    --inh-caps=-all,+setuid,+setgid,+chown --ambient-caps=-all,+setuid,+setgid,+chown -- "$@"
fi
exec "$@"
