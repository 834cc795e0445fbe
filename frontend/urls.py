"""Dashboard pages, and the chart data API under /api/charts/.

config/urls.py maps "api/" to the REST router before including this module; a
path the router does not know falls through to here, so /api/charts/... lands
on frontend.api (tests/frontend/test_api.py checks that it still does).
"""
from django.contrib.auth import views as auth_views
from django.urls import path

from . import api, views, views_cluster, views_records, views_settings, views_simulations, views_static, views_teams

chart_patterns = [
    path("api/charts/models/<int:pk>/ops/", api.ModelOpsChartView.as_view(), name="charts-model-ops"),
    path("api/charts/runs/compare/", api.RunCompareChartView.as_view(), name="charts-run-compare"),
    path("api/charts/runs/<int:pk>/curve/", api.RunCurveChartView.as_view(), name="charts-run-curve"),
    path("api/charts/runs/<int:pk>/dop/", api.RunDopChartView.as_view(), name="charts-run-dop"),
    path("api/charts/runs/<int:pk>/live/", api.RunLiveView.as_view(), name="charts-run-live"),
    path("api/charts/energy/", api.EnergyChartView.as_view(), name="charts-energy"),
    path("api/energy/", api.EnergySummaryView.as_view(), name="api-energy"),
    path("api/charts/cluster/", api.ClusterChartView.as_view(), name="charts-cluster"),
    path("api/charts/simulations/<int:pk>/", api.SimulationChartView.as_view(), name="charts-simulation"),
]

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.home, name="home"),
    path("team/", views.switch_team, name="switch-team"),
    path("models/", views.model_list, name="model-list"),
    path("models/upload/", views.model_upload, name="model-upload"),
    path("models/<int:pk>/", views.model_detail, name="model-detail"),
    path("models/<int:pk>/archive/", views.model_archive, name="model-archive"),
    path("models/<int:pk>/restore/", views.model_restore, name="model-restore"),
    path("runs/", views.run_list, name="run-list"),
    path("runs/new/", views.run_start, name="run-start"),
    path("runs/compare/", views.run_compare, name="run-compare"),
    path("runs/<int:pk>/", views.run_detail, name="run-detail"),
    path("runs/<int:pk>/<str:action>/", views.run_control, name="run-control"),
    path("runs/<int:pk>/records/import/", views_records.run_import_records, name="run-import-records"),
    path("cluster/", views.cluster, name="cluster"),
    path("cluster/jobs/new/", views_cluster.job_new, name="job-new"),
    path("cluster/jobs/preview/", views_cluster.job_preview, name="job-preview"),
    path("cluster/jobs/<int:pk>/", views_cluster.job_detail, name="job-detail"),
    path("cluster/jobs/<int:pk>/cancel/", views_cluster.job_cancel, name="job-cancel"),
    path("simulations/", views.simulations, name="simulations"),
    path("simulations/new/", views_simulations.simulation_new, name="simulation-new"),
    path("simulations/<int:pk>/", views.simulation_detail, name="simulation-detail"),
    path("simulations/<int:pk>/progress/", views_simulations.simulation_progress, name="simulation-progress"),
    path("simulations/<int:pk>/cancel/", views_simulations.simulation_cancel, name="simulation-cancel"),
    path("energy/", views.energy, name="energy"),
    path("settings/tokens/", views_settings.tokens, name="settings-tokens"),
    path("settings/tokens/<int:pk>/revoke/", views_settings.token_revoke, name="token-revoke"),
    path("teams/", views_teams.team_list, name="team-list-page"),
    path("teams/<int:pk>/", views_teams.team_detail, name="team-page"),
    path("teams/<int:pk>/invite/", views_teams.team_invite, name="team-invite"),
    path("teams/<int:pk>/leave/", views_teams.team_leave, name="team-leave"),
    path("teams/<int:pk>/members/<int:member_pk>/<str:action>/", views_teams.team_member, name="team-member"),
    path("teams/<int:pk>/webhook/<str:action>/", views_teams.team_webhook, name="team-webhook"),
    path("teams/<int:pk>/record-cache/", views_teams.team_record_cache, name="team-record-cache"),
    path("invitations/<int:pk>/<str:action>/", views_teams.invitation_answer, name="invitation-answer"),
    path("favicon.ico", views_static.favicon, name="favicon"),
    *chart_patterns,
]
