"""The address a request came from, as far as the deployment can vouch for it.

Every rate limit keyed on an address (the API's throttles, the dashboard and admin logins, the upload
limits) asks this one function. ``settings.NUM_PROXIES`` is how many reverse proxies we run in front of
the web server: 0 (the default) trusts nothing the client sent and uses REMOTE_ADDR, so a forged
``X-Forwarded-For`` changes nothing; N > 0 takes the N-th address from the right of X-Forwarded-For,
the one our outermost proxy appended, because anything left of it was written by the client.
The limits count :func:`client_network`: that address, or its /64 when it is an IPv6 one.
"""
from __future__ import annotations

import ipaddress

from django.conf import settings

#: An IPv6 client is counted by its /64: one subscriber or host is handed a whole /64 and can pick a new
#: address in it for every request, so counting single IPv6 addresses limits nothing.
IPV6_PREFIX = 64


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


def client_network(request) -> str:
    """What a rate limit counts for ``request``: the client's IPv4 address (also when written as an
    IPv4-mapped IPv6 address), or the /64 network of its IPv6 address; anything that is not an address
    (a forwarded hop we cannot parse) as it was written."""
    address = client_address(request)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)
