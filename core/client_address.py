"""The address a request came from, as far as the deployment can vouch for it.

Every rate limit keyed on an address (the API's throttles, the dashboard and admin logins, the upload
limits) asks this one function. ``settings.NUM_PROXIES`` is how many reverse proxies we run in front of
the web server: 0 (the default) trusts nothing the client sent and uses REMOTE_ADDR, so a forged
``X-Forwarded-For`` changes nothing; N > 0 takes the N-th address from the right of X-Forwarded-For,
the one our outermost proxy appended, because anything left of it was written by the client.
"""
from __future__ import annotations

from django.conf import settings


def client_address(request) -> str:
    """The client's address for ``request`` (a Django HttpRequest or a DRF Request)."""
    meta = request.META
    remote_addr = meta.get("REMOTE_ADDR") or ""
    num_proxies = int(getattr(settings, "NUM_PROXIES", 0) or 0)
    forwarded = meta.get("HTTP_X_FORWARDED_FOR")
    if num_proxies <= 0 or not forwarded:
        return remote_addr
    hops = [hop.strip() for hop in forwarded.split(",")]
    # Fewer hops than proxies: the request skipped a proxy; the leftmost hop is still the best we have.
    return hops[-min(num_proxies, len(hops))] or remote_addr
