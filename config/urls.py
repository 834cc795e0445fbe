from importlib import import_module

from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config.api_router import router

# Each app's api/urls.py registers its viewsets on the shared router and may
# add extra paths; import them before reading router.urls.
api_extra = []
for app in ("core", "tuning", "scheduling"):
    try:
        module = import_module(f"{app}.api.urls")
    except ModuleNotFoundError as exc:  # an app without an API yet
        if exc.name != f"{app}.api.urls" and exc.name != f"{app}.api":
            raise
        continue
    api_extra += getattr(module, "urlpatterns", [])

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include(api_extra + router.urls)),
    path("", include("frontend.urls")),
]

if settings.DEBUG:
    from django.conf.urls.static import static

    urlpatterns += static(settings.MEDIA_URL, document_root=settings.MEDIA_ROOT)
