"""Chart data API: Plotly-ready figure dicts, so automation can re-plot what the dashboard shows.

Every endpoint returns the exact figure the page draws (``{"data": [...],
"layout": {...}}``, plotly.js's figure format), built by frontend.charts from
the same selectors. Objects of other teams are 404s, as everywhere.
"""
from __future__ import annotations

from dataclasses import asdict

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.fast import not_modified, version_etag, with_validators
from core.api.strict import StrictQueryParamsMixin
from core.selectors import energy_model
from tuning import selectors as tuning_selectors
from scheduling.models import SimulationRun
from scheduling.selectors import COLOCATION_BASIS

from . import charts, clusterdata, presenters, queries
from .forms import parse_id_list
from .scope import get_scope

TAG = "charts"


class PlotlyFigureSerializer(serializers.Serializer):
    data = serializers.ListField(child=serializers.DictField(), help_text="plotly.js traces")
    layout = serializers.DictField(help_text="plotly.js layout")


class ApiErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField()
    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


class RunFiguresSerializer(serializers.Serializer):
    curve = PlotlyFigureSerializer(help_text="Best latency so far vs trials, end to end and per task.")
    dop = PlotlyFigureSerializer(help_text="DOP and parallel-vs-serial error per round.")


class CurveExtensionSerializer(serializers.Serializer):
    traces = serializers.ListField(child=serializers.IntegerField(), help_text="Indexes of the traces extended.")
    x = serializers.ListField(child=serializers.ListField(), help_text="New x values, one list per trace.")
    y = serializers.ListField(child=serializers.ListField(), help_text="New y values, one list per trace.")
    relayout = serializers.DictField(required=False, help_text="Layout changes to apply (Plotly.relayout).")


class RunExtensionSerializer(serializers.Serializer):
    curve = CurveExtensionSerializer(help_text="New points of the best-so-far traces (Plotly.extendTraces).")
    dop = CurveExtensionSerializer(help_text="New rounds of the DOP figure's two traces.")


class RunLiveSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(["full", "delta", "unchanged"], required=False,
                                   help_text="full: everything, figures included (the first load, or a "
                                             "refresh: see `refresh`); delta: only what is new since ?cursor=; "
                                             "unchanged: ?stamp= matched, only `run` is sent.")
    refresh = serializers.CharField(required=False,
                                    help_text="Why a poll with ?cursor= got the full payload.")
    stamp = serializers.CharField(help_text="Changes whenever anything shown changes; send it back as ?stamp=.")
    cursor = serializers.CharField(required=False,
                                   help_text="Where the data sent stand; send it back as ?cursor= to get a delta.")
    unchanged = serializers.BooleanField(required=False,
                                         help_text="True when ?stamp= matched: only `run` is sent then.")
    run = serializers.DictField(help_text="Status, progress and results; `display` holds formatted strings.")
    tasks = serializers.ListField(child=serializers.DictField(), required=False,
                                  help_text="Per-task rows: FLOPs, trials, best latency, GFLOP/s, status. In a "
                                            "delta only the rows that differ from the client's (by `index`).")
    dop_rounds = serializers.ListField(child=serializers.DictField(), required=False,
                                       help_text="In a delta, the rounds to append.")
    figures = RunFiguresSerializer(required=False)
    extend = RunExtensionSerializer(required=False, help_text="In a delta: what to append to the figures.")


class FigureSetSerializer(serializers.Serializer):
    available = serializers.BooleanField(help_text="False while there is no such data yet (e.g. a simulation "
                                                   "without results).")
    figures = serializers.DictField(child=PlotlyFigureSerializer(), help_text="Figures by name.")


class CompareSerializer(serializers.Serializer):
    figure = PlotlyFigureSerializer()
    runs = serializers.ListField(child=serializers.DictField(), help_text="Summary row per run.")


NOT_FOUND = OpenApiResponse(ApiErrorSerializer, description="Not found, or not one of your teams' objects.")


class ModelOpsChartView(APIView):
    @extend_schema(tags=[TAG], responses={200: PlotlyFigureSerializer, 404: NOT_FOUND},
                   summary="Operator histogram of a model (bar chart)")
    def get(self, request, pk: int):
        return Response(charts.op_histogram_figure(queries.model_for_user(request.user, pk)))


MAX_POINTS = OpenApiParameter("max_points", OpenApiTypes.INT, OpenApiParameter.QUERY, required=False,
                              description="Points per series after downsampling (20-5000; default 400).")


def _max_points(request) -> int | None:
    raw = request.query_params.get("max_points")
    if raw in (None, ""):
        return None
    if not raw.isdigit() or not 20 <= int(raw) <= 5000:
        raise ValidationError({"max_points": ["An integer from 20 to 5000."]})
    return int(raw)


class RunVersionedView(APIView):
    """A run's JSON, validated by the run's version: an unchanged poll (If-None-Match, else
    If-Modified-Since) is a 304 after one indexed read, and bodies are cached per run version."""

    kind = ""

    def get(self, request, pk: int):
        state = tuning_selectors.runs_for_user(request.user).filter(pk=pk).values_list(
            "version", "changed_at").first()
        if state is None:
            raise Http404("No such tuning run in your teams.")
        query = request.META.get("QUERY_STRING", "")
        hit = not_modified(request, version_etag(self.kind, pk, state[0], query), state[1])
        if hit is not None:
            return hit
        run = queries.run_for_user(request.user, pk)
        body = self.body(request, run)
        return with_validators(Response(body), version_etag(self.kind, pk, run.version, query), run.changed_at)

    def body(self, request, run) -> dict:
        raise NotImplementedError

    cached = staticmethod(presenters.cached_for_version)


class RunCurveChartView(RunVersionedView):
    kind = "curve"

    @extend_schema(tags=[TAG], parameters=[MAX_POINTS],
                   responses={200: PlotlyFigureSerializer, 304: None, 400: ApiErrorSerializer, 404: NOT_FOUND},
                   summary="Best latency so far vs trials (end to end and per task)",
                   description="From tuning.selectors.best_so_far_curve, downsampled server-side. ETag and "
                               "Last-Modified follow the run's version: If-None-Match gets a 304 when unchanged.")
    def get(self, request, pk: int):
        return super().get(request, pk)

    def body(self, request, run) -> dict:
        max_points = _max_points(request)
        return self.cached(f"curve:{max_points}", run,
                           lambda: presenters.run_curve_figure(run, max_points=max_points))


class RunDopChartView(RunVersionedView):
    kind = "dop"

    @extend_schema(tags=[TAG], responses={200: PlotlyFigureSerializer, 304: None, 404: NOT_FOUND},
                   summary="DOP and parallel-vs-serial error per round",
                   description="ETag / Last-Modified follow the run's version (304 when unchanged).")
    def get(self, request, pk: int):
        return super().get(request, pk)

    def body(self, request, run) -> dict:
        return self.cached("dop", run, lambda: presenters.run_dop_figure(run))


LIVE_PARAMETERS = [
    OpenApiParameter("stamp", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False,
                     description="The `stamp` of the previous answer: when nothing shown changed only the run's "
                                 "numbers come back (mode unchanged)."),
    OpenApiParameter("cursor", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False,
                     description="The `cursor` of the previous answer: only what is new since comes back (mode "
                                 "delta), or everything with the reason in `refresh` where a delta cannot be exact. "
                                 "Anything but a cursor the server sent is a 400."),
    OpenApiParameter("points", OpenApiTypes.INT, OpenApiParameter.QUERY, required=False,
                     description="With cursor: the most points one curve trace of the page holds (0-999999999); "
                                 "past twice a fresh curve's size the curve is re-sent thinned."),
]


class RunLiveView(RunVersionedView):
    kind = "live"

    @extend_schema(
        tags=[TAG], responses={200: RunLiveSerializer, 304: None, 400: ApiErrorSerializer, 404: NOT_FOUND},
        parameters=LIVE_PARAMETERS,
        summary="Live state of a run: numbers, task table, DOP rounds and both figures, or what is new",
        description="The run page polls this every 2 s with If-None-Match, ?stamp= and ?cursor=: an unchanged "
                    "run is a 304 with no body (the ETag follows the run's version, bumped by every write); "
                    "a changed one answers a delta (new rounds, changed task rows, new curve points for "
                    "Plotly.extendTraces) built from the rows after the cursor only; the first load, and a "
                    "poll whose delta cannot be exact, get the full payload (figures for Plotly.react).")
    def get(self, request, pk: int):
        return super().get(request, pk)

    def body(self, request, run) -> dict:
        cursor, points = self._delta_params(request)
        stamp = request.query_params.get("stamp")
        rounds = None
        if stamp:
            rounds = queries.dop_round_stats(run)
            n_rounds = rounds[0]
            current = presenters.live_stamp(run, n_rounds)
            if current == stamp:  # e.g. only a heartbeat since: the numbers alone, cached per version too
                return self.cached("numbers", run, lambda: {
                    "mode": "unchanged", "stamp": current, "unchanged": True,
                    "run": presenters.run_numbers(run, dop_rounds=n_rounds)})
        if cursor is not None:
            # Clients polling in step send the same cursor: one delta per version and cursor.
            return self.cached(f"delta:{cursor}:{points}", run,
                               lambda: presenters.run_live_delta(run, cursor, points, rounds=rounds))
        return self.cached("live", run, lambda: presenters.run_live_payload(run))

    @staticmethod
    def _delta_params(request):
        raw_cursor, raw_points = request.query_params.get("cursor"), request.query_params.get("points")
        errors = {}
        cursor = points = None
        if raw_cursor not in (None, ""):
            try:
                cursor = presenters.parse_cursor(raw_cursor)
            except ValueError as exc:
                errors["cursor"] = [str(exc)]
        if raw_points not in (None, ""):
            try:
                points = presenters.parse_points(raw_points)
            except ValueError as exc:
                errors["points"] = [str(exc)]
        if errors:
            raise ValidationError(errors)
        return cursor, points or 0


RUNS = OpenApiParameter("runs", OpenApiTypes.STR, OpenApiParameter.QUERY, required=True,
                        description="Two or more run ids, comma-separated (or repeated).")


class RunCompareChartView(APIView):
    @extend_schema(tags=[TAG], parameters=[RUNS],
                   responses={200: CompareSerializer, 400: ApiErrorSerializer, 404: NOT_FOUND},
                   summary="End-to-end curves of several runs overlaid, with a summary per run")
    def get(self, request):
        try:
            ids = parse_id_list(request.query_params.getlist("runs"))
        except ValueError as exc:
            raise ValidationError({"runs": [str(exc)]}) from None
        if not 2 <= len(ids) <= 8:
            raise ValidationError({"runs": ["Give from 2 to 8 run ids."]})
        runs = queries.runs_for_user_by_ids(request.user, ids)
        curves = {r.pk: presenters.curve_for(r, max_points=presenters.CURVE_MAX_POINTS) for r in runs}
        summary = []
        for r in runs:
            numbers = presenters.run_numbers(r)
            numbers.pop("actions", None)
            summary.append({**numbers, "model": r.model.name, "team": r.team.name, "target": r.target,
                            "measurement_mode": r.measurement_mode, "dop_mode": r.dop_mode})
        return Response({"figure": charts.compare_figure(runs, curves), "runs": summary})


TEAM = OpenApiParameter("team", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False,
                        description="One of your teams, by id or slug; default all of them.")


def _team_ids(request) -> list[int]:
    all_ids = [t.pk for t in get_scope(request).teams]
    raw = request.query_params.get("team")
    if raw in (None, ""):
        return all_ids
    by_slug = {t.slug: t.pk for t in get_scope(request).teams}
    team_id = int(raw) if raw.isdigit() else by_slug.get(raw)
    if team_id not in all_ids:
        raise Http404("No such team among yours.")
    return [team_id]


class EnergyChartView(APIView):
    @extend_schema(tags=[TAG], parameters=[TEAM], responses={200: PlotlyFigureSerializer, 404: NOT_FOUND},
                   summary="Tuning energy per team and month (wall-hours until energy is recorded)")
    def get(self, request):
        return Response(charts.energy_figure(queries.energy_by_team_month(_team_ids(request))))


class EnergyMonthSerializer(serializers.Serializer):
    team_id = serializers.IntegerField()
    team_name = serializers.CharField()
    month = serializers.DateField(help_text="First day of the calendar month (UTC).")
    runs = serializers.IntegerField()
    trials = serializers.IntegerField()
    wall_hours = serializers.FloatField()
    runs_with_energy = serializers.IntegerField()
    energy_kwh = serializers.FloatField(allow_null=True, help_text="Tuning energy; null until a run records it.")
    sources = serializers.ListField(child=serializers.CharField(),
                                    help_text="How tuning energy was obtained: rapl, nvml, modeled.")
    saved_kwh = serializers.FloatField(allow_null=True, help_text="Saved by Trimmer (see each run's basis).")
    carbon_g = serializers.FloatField(allow_null=True)
    colocation_saved_kwh = serializers.FloatField(allow_null=True, help_text="Saved by Horus co-location (modeled).")
    colocation_gpu_hours = serializers.FloatField(allow_null=True)


class EnergySummarySerializer(serializers.Serializer):
    months = EnergyMonthSerializer(many=True)
    colocation_basis = serializers.CharField()
    energy_model = serializers.DictField(help_text="Watts and grid intensity behind modeled figures.")


class EnergySummaryView(StrictQueryParamsMixin, APIView):
    query_params = {"get": ["team"]}

    @extend_schema(tags=[TAG], parameters=[TEAM], responses={200: EnergySummarySerializer, 404: NOT_FOUND},
                   summary="Energy and carbon per team and month: tuning, saved by Trimmer and by co-location")
    def get(self, request):
        model = energy_model()
        return Response({
            "months": [asdict(r) for r in queries.energy_by_team_month(_team_ids(request))],
            "colocation_basis": COLOCATION_BASIS,
            "energy_model": {**model.as_dict(), "origin": model.origin},
        })


class ClusterChartView(APIView):
    @extend_schema(tags=[TAG], parameters=[TEAM],
                   responses={200: FigureSetSerializer, 404: NOT_FOUND},
                   summary="Cluster figures (GPU utilization and memory, jobs per state)",
                   description="The figures are drawn (empty) before any node reported.")
    def get(self, request):
        return Response(clusterdata.cluster_figures(_team_ids(request)))


class SimulationChartView(APIView):
    @extend_schema(tags=[TAG],
                   responses={200: FigureSetSerializer, 304: None, 404: NOT_FOUND},
                   summary="Figures of one simulation run (policies compared)",
                   description="ETag / Last-Modified follow the simulation's status: 304 when unchanged.")
    def get(self, request, pk: int):
        # A simulation's figures change only when its status does (results are written once, at the end).
        state = SimulationRun.objects.filter(pk=pk, team_id__in=get_scope(request).all_team_ids).values_list(
            "status", "finished_at").first()
        if state is None:
            raise Http404("No such simulation in your teams.")
        etag = version_etag("simulation", pk, f"{state[0]}|{state[1]}", request.META.get("QUERY_STRING", ""))
        hit = not_modified(request, etag, state[1])
        if hit is not None:
            return hit
        return with_validators(Response(clusterdata.simulation_figures(get_scope(request), pk)), etag, state[1])
