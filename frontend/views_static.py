"""/favicon.ico for pages that do not name an icon (Django's admin asks for it: a 404 in its console)."""
from __future__ import annotations

from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static


def favicon(request):
    return HttpResponsePermanentRedirect(static("frontend/favicon.svg"))
