from django.urls import path

from . import views

urlpatterns = [
    path("teams/<str:team_ref>/record-cache/", views.TeamCacheSettingsView.as_view(), name="team-record-cache"),
    path("runs/<int:run_id>/record-cache/", views.RunCacheView.as_view(), name="run-record-cache"),
    path("record-cache/", views.CacheStatsView.as_view(), name="record-cache-stats"),
    path("record-cache/export/", views.CacheExportView.as_view(), name="record-cache-export"),
    path("record-cache/import/", views.CacheImportView.as_view(), name="record-cache-import"),
    path("record-cache/purge/", views.CachePurgeView.as_view(), name="record-cache-purge"),
]
