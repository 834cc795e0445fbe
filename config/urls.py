from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from core.api import urls as core_api
from core.api.errors import api_not_found
from core.api.router import router
from recordcache.api import urls as recordcache_api
from scheduling.api import urls as scheduling_api
from tuning.api import urls as tuning_api

# Each app's api/urls.py registers its viewsets on the shared router when imported (above) and may add
# extra paths; router.urls is read after all of them.
api_extra = [*core_api.urlpatterns, *tuning_api.urlpatterns, *scheduling_api.urlpatterns, *recordcache_api.urlpatterns]

# An outage raised outside a view (a middleware writing an upload to a full disk) is a 503, not a 500.
handler500 = "core.outages.server_error"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # the split view serves Swagger UI's init script from a URL, not inline: the CSP allows no inline script
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include(api_extra + router.urls)),
    path("scheduler/extender/", include("scheduling.api.extender_urls")),
    path("", include("frontend.urls")),  # also serves /api/charts/ (the dashboard's chart data)
    path("api/<path:rest>", api_not_found, name="api-not-found"),  # last: any other /api/ path, a JSON 404
]

handler404 = "core.api.errors.page_not_found"

if settings.DEBUG:
    from django.conf.urls.static import static

    urlpatterns += static(settings.MEDIA_URL, document_root=settings.MEDIA_ROOT)
