"""Cluster and simulation pages over the scheduling app (read through scheduling.selectors).

Nodes and GPUs are shared infrastructure (every signed-in user sees them, as
the scheduling API does); GPU jobs, placements and simulations belong to teams
and follow the dashboard's team scope (another team's simulation is a 404).
Until the scheduling app has recorded anything, the pages say "no data yet".
"""
from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict

from django.db.models import Count
from django.http import Http404
from django.utils import timezone

from common.series import thin
from scheduling import selectors
from scheduling.adapters import SIMULATION_SECONDS_PER_UNIT
from scheduling.models import GpuJob, GpuTelemetry, Placement, SimulationRun

from . import charts

TELEMETRY_WINDOW = dt.timedelta(hours=1)
TELEMETRY_MAX_ROWS = 20_000
TELEMETRY_POINTS_PER_GPU = 300
RECENT_JOBS = 30


# --- cluster ----------------------------------------------------------------------------------


def _gpus():
    return list(selectors.gpus())


def _nodes():
    now = timezone.now()
    nodes = list(selectors.nodes())
    for n in nodes:
        n.fresh = selectors.is_node_fresh(n, now)
    return nodes


def _telemetry_series(gpus) -> dict[str, tuple[list, list]]:
    since = timezone.now() - TELEMETRY_WINDOW
    labels = {g.pk: f"{g.node.name}/gpu{g.index}" for g in gpus}
    rows = (GpuTelemetry.objects.filter(ts__gte=since, gpu_id__in=list(labels)).order_by("-ts")
            .values_list("gpu_id", "ts", "util_pct")[:TELEMETRY_MAX_ROWS])
    series: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
    for gpu_id, ts, util in reversed(list(rows)):
        xs, ys = series[gpu_id]
        xs.append(ts.isoformat())
        ys.append(util)
    return {labels[g]: thin(xs, ys, TELEMETRY_POINTS_PER_GPU) for g, (xs, ys) in series.items()}


def _jobs(team_ids: list[int]):
    jobs_qs = GpuJob.objects.filter(team_id__in=team_ids)
    state_counts = dict(jobs_qs.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    recent = list(jobs_qs.select_related("model", "team").order_by("-created_at")[:RECENT_JOBS])
    placements = {p.job_id: p for p in Placement.objects.filter(job__in=recent, released_at__isnull=True)
                  .select_related("gpu", "gpu__node")}
    for job in recent:
        job.active_placement = placements.get(job.pk)
    return state_counts, recent


def cluster_figures_for(gpus, state_counts) -> dict:
    labels = [f"{g.node.name}/gpu{g.index}" for g in gpus]
    util = [g.latest_util_pct for g in gpus]
    mem = [(g.latest_mem_used_mb / g.memory_total_mb * 100) if g.latest_mem_used_mb is not None
           and g.memory_total_mb else None for g in gpus]
    states = [s for s, _ in GpuJob.State.choices]
    return {
        "utilization": charts.bar_figure(labels, util, title="GPU utilization (latest sample)",
                                         y_title="utilization (%)", y_range=[0, 100]),
        "memory": charts.bar_figure(labels, mem, title="GPU memory used (latest sample)",
                                    y_title="memory used (% of total)", color="#9467bd", y_range=[0, 100]),
        "telemetry": charts.lines_figure(_telemetry_series(gpus), title="GPU utilization, last hour",
                                         x_title="time (UTC)", y_title="utilization (%)", y_range=[0, 100]),
        "jobs": charts.jobs_by_state_figure([GpuJob.State(s).label for s in states],
                                            [state_counts.get(s, 0) for s in states],
                                            title="GPU jobs by state (your teams)"),
    }


def cluster_context(scope) -> dict:
    nodes = _nodes()
    gpus = _gpus()
    state_counts, recent = _jobs(scope.team_ids)
    predictor = selectors.active_predictor_version()
    has_data = bool(nodes or gpus or state_counts)
    return {
        "available": has_data, "nodes": nodes, "gpus": gpus, "recent_jobs": recent,
        "state_counts": state_counts, "predictor": predictor,
        "figures": cluster_figures_for(gpus, state_counts) if has_data else {},
    }


def cluster_figures(team_ids: list[int]) -> dict:
    gpus = _gpus()
    state_counts, _ = _jobs(team_ids)
    return {"available": True, "figures": cluster_figures_for(gpus, state_counts)}


# --- simulations ------------------------------------------------------------------------------


def simulations_context(scope) -> dict:
    sims = list(SimulationRun.objects.filter(team_id__in=scope.team_ids).select_related("team", "trace_upload")
                .order_by("-created_at")[:100])
    for s in sims:
        s.method = (s.results or {}).get("method") or (s.parameters or {}).get("method") or ""
        s.n_jobs = ((s.results or {}).get("trace") or {}).get("jobs_used")
    return {"available": bool(sims), "simulations": sims,
            "status_counts": Counter(s.status for s in sims)}


def _simulation(scope, pk: int):
    # Any of the user's teams (not only the switcher's): like every detail page.
    sim = SimulationRun.objects.filter(pk=pk, team_id__in=scope.all_team_ids).select_related("team").first()
    if sim is None:
        raise Http404("No such simulation in your teams.")
    return sim


REPLAY_BARS = (("makespan_h", "makespan (h)"), ("mean_wait_s", "mean wait (s)"),
               ("util_mean_pct", "delivered GPU utilization (%)"), ("occupancy_pct", "GPU occupancy (%)"),
               ("mean_jct_s", "mean JCT (s)"))
FILL_BARS = (("allocated_share", "GPU capacity allocated (share)"), ("frag_rate", "fragmentation rate"),
             ("unallocated_gpus", "unallocated GPUs"), ("failed", "pods that could not be placed"))


def _in_time_unit(seconds: list, title: str) -> tuple[list, str]:
    largest = max((abs(v) for v in seconds if v is not None), default=0.0)
    unit, size = next(((u, z) for u, z in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)) if largest >= 2 * z),
                      ("s", 1.0))
    base = title.rsplit(" (", 1)[0]
    return [None if v is None else v / size for v in seconds], f"{base} ({unit})"


def simulation_figures_for(sim) -> dict:
    results = sim.results or {}
    table = results.get("table") or []
    policies = results.get("policies") or {}
    if not table:
        return {}
    method = results.get("method", "replay")
    names = [row["policy"] for row in table]
    # jsonb does not keep key order: follow the table (a list), i.e. the order the policies ran.
    ordered = [(n, policies[n]) for n in names if n in policies]
    figures = {}
    for key, title in (FILL_BARS if method == "fill" else REPLAY_BARS):
        if any(row.get(key) is not None for row in table):
            values = [row.get(key) for row in table]
            scale = next((size for suffix, size in UNIT_SUFFIXES if key.endswith(suffix)), None)
            if scale is not None:  # a time: in days, hours or minutes (whichever the largest bar reads best in)
                values, title = _in_time_unit([None if v is None else v * scale for v in values], title)
            figures[key] = charts.bar_figure(names, values, title=title, y_title=title, height=280)
    if method == "fill":
        series = {name: ([p.get("arrived_share") for p in r.get("curve") or []],
                         [p.get("allocated_share") for p in r.get("curve") or []]) for name, r in ordered}
        figures["curve"] = charts.lines_figure(series, title="Allocated vs arrived GPU request",
                                               x_title="arrived request (share of capacity)",
                                               y_title="allocated (share of capacity)")
        figures["fragmentation"] = charts.fill_fragmentation_figure(ordered)
    else:
        series = {}
        for name, r in ordered:
            ts = r.get("timeseries") or {}
            series[name] = ([t / 3600 for t in ts.get("t_s") or []], ts.get("util_pct") or [])
        figures["curve"] = charts.lines_figure(series, title="Delivered cluster GPU utilization over time",
                                               x_title="simulated time (h)", y_title="delivered utilization (%)",
                                               y_range=[0, 105])
    return figures


# The simulator's result columns, in words; a suffix says the unit the value is in.
SIMULATION_COLUMNS = {
    "makespan_h": "Makespan", "mean_wait_s": "Mean wait", "p95_wait_s": "95th-percentile wait",
    "mean_jct_s": "Mean job completion time", "util_mean_pct": "Mean GPU utilization",
    "occupancy_pct": "GPU occupancy", "shared_frac": "Share of jobs co-located", "slowdown": "Mean slowdown",
    "oom": "Out-of-memory events", "migrations": "Migrations",
}
UNIT_SUFFIXES = (("_s", 1.0), ("_h", 3600.0))


def fmt_long_duration(seconds: float) -> str:
    """Simulated times span seconds to months: days, hours or minutes, whichever reads best."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if abs(seconds) >= 2 * size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.1f} s"


def fmt_simulation_value(column: str, value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    for suffix, scale in UNIT_SUFFIXES:
        if column.endswith(suffix):
            return fmt_long_duration(value * scale)
    if column.endswith("_pct"):
        return f"{value:.1f} %"
    if column.endswith("_frac"):
        return f"{value * 100:.1f} %"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3f}"


def simulation_column_label(column: str) -> str:
    return SIMULATION_COLUMNS.get(column) or column.replace("_", " ").capitalize()


def assumption_rows(assumptions: dict, prefix: str = "") -> list[tuple[str, str]]:
    """The simulator's assumptions as (setting, value) rows: nested settings get a path, numbers a
    readable precision (instead of a printed Python dict)."""
    rows: list[tuple[str, str]] = []
    for key, value in assumptions.items():
        label = f"{prefix} › {key.replace('_', ' ')}" if prefix else key.replace("_", " ")
        if isinstance(value, dict):
            rows.extend(assumption_rows(value, label))
        elif isinstance(value, float):
            rows.append((label, f"{value:.4g}"))
        elif isinstance(value, (list, tuple)):
            rows.append((label, ", ".join(str(v) for v in value)))
        else:
            rows.append((label, str(value)))
    return rows


def simulation_detail_context(scope, pk: int) -> dict:
    sim = _simulation(scope, pk)
    results = sim.results or {}
    table = results.get("table") or []
    keys = [c for c in (table[0].keys() if table else []) if c != "policy"]
    columns = [simulation_column_label(c) for c in keys]
    rows = [(row.get("policy"), [fmt_simulation_value(c, row.get(c)) for c in keys]) for row in table]
    active = sim.status in SimulationRun.ACTIVE
    return {"sim": sim, "results": results, "table": table, "columns": columns, "rows": rows,
            "figures": simulation_figures_for(sim), "cluster": results.get("cluster") or {},
            "assumptions": assumption_rows(results.get("assumptions") or {}), "trace": results.get("trace") or {},
            "cost_minutes": sim.cost_units * SIMULATION_SECONDS_PER_UNIT / 60,
            "waiting_in_fair_queue": sim.status == SimulationRun.Status.QUEUED and sim.dispatched_at is None,
            "can_cancel": active and sim.team_id in scope.writable_ids,
            "stopping": sim.status == SimulationRun.Status.RUNNING and sim.cancel_requested_at is not None}


def simulation_figures(scope, pk: int) -> dict:
    sim = _simulation(scope, pk)
    return {"available": bool(sim.results), "figures": simulation_figures_for(sim)}
