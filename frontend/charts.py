"""Plotly figures built server-side with plotly.py.

Every builder returns a plain figure dict (``{"data": [...], "layout": {...}}``)
that plotly.js draws with ``Plotly.newPlot``/``Plotly.react`` and that the chart
API returns as is, so automation can re-plot the same figure. Data arrive
already downsampled (tuning.selectors.best_so_far_curve thins each series), so
a run of tens of thousands of measurements stays a few hundred points a trace.
"""
from __future__ import annotations

import textwrap

import plotly.graph_objects as go

# A small explicit template: the default "plotly" template adds ~7 KB to every
# figure, which the live view would otherwise re-send every 2 s.
_TEMPLATE = go.layout.Template(layout={
    "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#222"},
    "colorway": ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"],
    "paper_bgcolor": "#fff", "plot_bgcolor": "#fff",
    "xaxis": {"gridcolor": "#eee", "linecolor": "#999", "zerolinecolor": "#ddd"},
    "yaxis": {"gridcolor": "#eee", "linecolor": "#999", "zerolinecolor": "#ddd"},
    "hovermode": "closest",
})
E2E_COLOR = "#111"
# Plotly labels a log axis's minor ticks with their first digit only, so 0.5 ms and 5 ms both read "5":
# a general number format writes every tick in full.
LOG_AXIS = {"type": "log", "tickformat": "~g"}


def _layout(**kwargs) -> dict:
    base = {"template": _TEMPLATE, "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "autosize": True,
            "legend": {"font": {"size": 11}}}
    base.update(kwargs)
    return base


def figure_dict(fig: go.Figure) -> dict:
    return fig.to_plotly_json()


def empty_figure(message: str, *, title: str = "", height: int = 260) -> dict:
    fig = go.Figure(layout=_layout(
        title={"text": title}, height=height,
        xaxis={"visible": False}, yaxis={"visible": False},
        # wrapped: a one-line note is clipped on a phone-width chart
        annotations=[{"text": "<br>".join(textwrap.wrap(message, 48, break_long_words=False,
                                                       break_on_hyphens=False)) or message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                      "font": {"size": 14, "color": "#666"}}],
    ))
    return figure_dict(fig)


def plain(text) -> str:
    """User-given names (models, tasks, teams, policies) shown as text, never as plotly.js pseudo-HTML."""
    return str(text).replace("<", "‹").replace(">", "›")


def _ms(values):
    return [None if v is None else v * 1e3 for v in values]


# --- model ----------------------------------------------------------------------------------


def op_histogram_figure(model) -> dict:
    """Bar chart of the model's ONNX operator counts, most frequent first."""
    items = sorted((model.op_histogram or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    if not items:
        return empty_figure("No operators recorded for this model.", title="Operator histogram")
    ops, counts = [plain(k) for k, _ in items], [v for _, v in items]
    fig = go.Figure(
        go.Bar(x=ops, y=counts, marker={"color": "#1f77b4"}, hovertemplate="%{x}: %{y}<extra></extra>",
               name="nodes"),
        layout=_layout(title={"text": f"Operator histogram of {plain(model.name)}"}, height=360,
                       xaxis={"title": {"text": "ONNX operator"}, "tickangle": -40 if len(ops) > 8 else 0},
                       yaxis={"title": {"text": "nodes"}}, showlegend=False),
    )
    return figure_dict(fig)


# --- tuning runs --------------------------------------------------------------------------------


def _short(name: str, n: int = 38) -> str:
    name = plain(name)
    return name if len(name) <= n else name[: n - 1] + "…"


def unmeasured_note(missing: list[str]) -> str:
    """Why the end-to-end estimate has not started: the tasks with no valid measurement, by name."""
    names = ", ".join(_short(n, 30) for n in missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                                          else "")
    return (f"end-to-end estimate not started: {len(missing)} task(s) have no valid measurement yet: {names}"
            if missing else "end-to-end estimate starts once every task has a valid measurement")


def best_so_far_figure(curve: dict, *, run_id: int | None = None, missing: list[str] | None = None) -> dict:
    """End-to-end estimate (top) and per-task best latency (bottom) vs measured trials.

    `curve` is tuning.selectors.best_so_far_curve's output; `missing` names the tasks with no valid
    measurement (tuning.selectors.tasks_without_measurement; else read from the curve).
    """
    tasks = curve.get("tasks") or {}
    e2e = curve.get("end_to_end") or {"trials": [], "estimate_s": []}
    if not tasks or not any(t["trials"] for t in tasks.values()):
        return empty_figure("No measurements yet: the curve appears as soon as the first round is stored.",
                            title="Best latency so far", height=520)
    data = []
    data.append(go.Scatter(
        x=e2e["trials"], y=_ms(e2e["estimate_s"]), name="end-to-end estimate", mode="lines",
        line={"color": E2E_COLOR, "width": 2.5, "shape": "hv"}, xaxis="x", yaxis="y",
        hovertemplate="trial %{x}<br>estimate %{y:.4g} ms<extra>end to end</extra>",
    ))
    for index in sorted(tasks, key=lambda i: int(i)):
        t = tasks[index]
        data.append(go.Scatter(
            x=t["trials"], y=_ms(t["best_s"]), name=f"T{index} {_short(t.get('name', ''))}", mode="lines",
            line={"width": 1.3, "shape": "hv"}, xaxis="x", yaxis="y2", legendgroup="tasks",
            hovertemplate=f"T{index}<br>trial %{{x}}<br>best %{{y:.4g}} ms<extra></extra>",
        ))
    layout = _layout(
        title={"text": "Best latency so far vs trials"}, height=560, uirevision=f"curve-{run_id}",
        xaxis={"title": {"text": "measured trials (whole run)"}, "anchor": "y2"},
        yaxis={"title": {"text": "end-to-end (ms)"}, "domain": [0.6, 1.0], **LOG_AXIS},
        yaxis2={"title": {"text": "per task (ms)"}, "domain": [0.0, 0.48], **LOG_AXIS},
        legend={"font": {"size": 10}},
    )
    if not e2e["trials"]:
        if missing is None:
            missing = [t.get("name", f"T{i}") for i, t in sorted(tasks.items(), key=lambda kv: int(kv[0]))
                       if not any(v is not None for v in t["best_s"])]
        layout["annotations"] = [{
            "text": unmeasured_note(missing), "showarrow": False,
            "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.8, "font": {"color": "#666"}}]
    return figure_dict(go.Figure(data=data, layout=layout))


def curve_extension(task_indexes: list[int], e2e: tuple[list, list], tasks: dict[int, tuple[list, list]]) -> dict:
    """New points of best_so_far_figure's traces, as Plotly.extendTraces takes them: {"traces": [trace
    indexes], "x": [[...] per trace], "y": [[...] per trace]} (trace 0 is the end-to-end estimate, then one
    per task in index order, as best_so_far_figure draws them; latencies in ms, as drawn)."""
    out: dict = {"traces": [], "x": [], "y": []}
    series = [(0, e2e)] + [(k, tasks[i]) for k, i in enumerate(task_indexes, 1)]
    for trace, (xs, ys) in series:
        if xs:
            out["traces"].append(trace)
            out["x"].append(list(xs))
            out["y"].append(_ms(ys))
    return out


def dop_dticks(n_rounds: int, max_dop: int | None) -> dict:
    """The DOP figure's tick spacing for `n_rounds` rounds (as dop_figure sets it), for Plotly.relayout."""
    return {"xaxis.dtick": max(1, -(-n_rounds // 15)),
            "yaxis.dtick": 1 if max_dop is not None and max_dop <= 16 else None}


def dop_extension(rounds: list[dict], *, n_rounds: int, max_dop: int | None) -> dict:
    """New rounds for dop_figure's two traces (DOP bars, error line in %), as Plotly.extendTraces takes
    them, with the axis ticks for the new round count (`relayout`)."""
    if not rounds:
        return {"traces": [], "x": [], "y": [], "relayout": {}}
    xs = [r["round_index"] for r in rounds]
    errors = [None if r["mean_error"] is None else r["mean_error"] * 100 for r in rounds]
    return {"traces": [0, 1], "x": [xs, list(xs)], "y": [[r["dop"] for r in rounds], errors],
            "relayout": dop_dticks(n_rounds, max_dop)}


def dop_figure(rounds: list[dict], *, run_id: int | None = None) -> dict:
    """Degree of parallelism (bars) and mean parallel-vs-serial error (line, %) per measurement round."""
    if not rounds:
        return empty_figure("No DOP rounds recorded yet.", title="DOP and parallel-vs-serial error per round")
    xs = [r["round_index"] for r in rounds]
    errors = [None if r["mean_error"] is None else r["mean_error"] * 100 for r in rounds]
    ticks = dop_dticks(len(xs), max(r["dop"] for r in rounds))
    data = [
        go.Bar(x=xs, y=[r["dop"] for r in rounds], name="DOP", marker={"color": "#9fc5e8"},
               hovertemplate="round %{x}: DOP %{y}<extra></extra>"),
        go.Scatter(x=xs, y=errors, name="mean error (%)", mode="lines+markers", yaxis="y2",
                   line={"color": "#d62728"}, marker={"size": 4}, connectgaps=False,
                   hovertemplate="round %{x}: error %{y:.2f}%<extra></extra>"),
    ]
    layout = _layout(
        title={"text": "DOP and parallel-vs-serial error per round"}, height=320, uirevision=f"dop-{run_id}",
        margin={"l": 60, "r": 70, "t": 40, "b": 50},
        # Rounds are integers: ticks on whole rounds only (plotly's auto ticks showed -0.5, 0.5, 1.5).
        xaxis={"title": {"text": "round"}, "tickmode": "linear", "tick0": 0, "tickformat": "d",
               "dtick": ticks["xaxis.dtick"]},
        yaxis={"title": {"text": "degree of parallelism"}, "rangemode": "tozero", "dtick": ticks["yaxis.dtick"]},
        yaxis2={"title": {"text": "mean error (%)"}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                "showgrid": False},
        legend={"orientation": "h", "y": 1.12, "x": 1, "xanchor": "right"}, bargap=0.15,
    )
    return figure_dict(go.Figure(data=data, layout=layout))


def compare_figure(runs, curves: dict[int, dict]) -> dict:
    """End-to-end best-latency curves of several runs, overlaid."""
    data = []
    for run in runs:
        e2e = (curves.get(run.pk) or {}).get("end_to_end") or {}
        if not e2e.get("trials"):
            continue
        data.append(go.Scatter(
            x=e2e["trials"], y=_ms(e2e["estimate_s"]), mode="lines", line={"shape": "hv", "width": 2},
            name=f"run {run.pk}: {plain(run.model.name)} · {run.measurement_mode} · DOP {run.dop_mode}",
            hovertemplate=f"run {run.pk}<br>trial %{{x}}<br>%{{y:.4g}} ms<extra></extra>",
        ))
    if not data:
        return empty_figure("None of these runs has an end-to-end estimate yet.", title="Runs compared")
    # onnxruntime's latency as each run measured it (same inputs and threads): the yardstick to beat
    right = max((max(t.x) for t in data if t.x), default=1)
    for run in runs:
        if run.ort_latency_s is None:
            continue
        data.append(go.Scatter(
            x=[0, right], y=[run.ort_latency_s * 1e3] * 2, mode="lines", line={"dash": "dash", "width": 1.5},
            name=f"onnxruntime (run {run.pk})",
            hovertemplate=f"onnxruntime, run {run.pk}<br>%{{y:.4g}} ms<extra></extra>",
        ))
    fig = go.Figure(data=data, layout=_layout(
        title={"text": "End-to-end best latency so far"}, height=440,
        xaxis={"title": {"text": "measured trials"}}, yaxis={"title": {"text": "estimated latency (ms)"},
                                                             **LOG_AXIS},
        legend={"orientation": "h", "y": -0.2},
    ))
    return figure_dict(fig)


# --- energy -----------------------------------------------------------------------------------


def energy_figure(rows) -> dict:
    """Per team and month: energy (kWh) where recorded, otherwise tuning wall-hours."""
    if not rows:
        return empty_figure("No tuning runs in these teams yet.", title="Tuning per month")
    with_energy = any(r.energy_kwh is not None for r in rows)
    teams = sorted({r.team_name for r in rows})
    months = sorted({r.month for r in rows})
    labels = [m.strftime("%Y-%m") for m in months]
    data = []
    for team in teams:
        by_month = {r.month: r for r in rows if r.team_name == team}
        if with_energy:
            ys = [by_month[m].energy_kwh if m in by_month else None for m in months]
        else:
            ys = [by_month[m].wall_hours if m in by_month else 0 for m in months]
        data.append(go.Bar(x=labels, y=ys, name=plain(team)))
    title = "Tuning energy per month (kWh)" if with_energy else \
        "Tuning wall-hours per month (energy not measured yet)"
    fig = go.Figure(data=data, layout=_layout(
        title={"text": title}, height=340, barmode="group",
        xaxis={"title": {"text": "month"}, "type": "category"},
        yaxis={"title": {"text": "kWh" if with_energy else "wall-hours"}},
    ))
    return figure_dict(fig)


# --- scheduling ---------------------------------------------------------------------------------


def bar_figure(labels: list[str], values: list[float], *, title: str, y_title: str, height: int = 320,
               color: str = "#1f77b4", y_range: list[float] | None = None) -> dict:
    if not labels:
        return empty_figure("No data yet.", title=title)
    yaxis = {"title": {"text": y_title}}
    if y_range is not None:
        yaxis["range"] = y_range
    fig = go.Figure(go.Bar(x=[plain(x) for x in labels], y=values, marker={"color": color}),
                    layout=_layout(title={"text": title}, height=height, showlegend=False,
                                   xaxis={"type": "category"}, yaxis=yaxis))
    return figure_dict(fig)


def jobs_by_state_figure(labels: list[str], counts: list[int], *, title: str) -> dict:
    """GPU jobs per state; with no job at all it says so instead of drawing a -1..1 axis of zero bars."""
    if not any(counts):
        return empty_figure("No data yet: no GPU jobs in these teams.", title=title)
    return bar_figure(labels, counts, title=title, y_title="jobs", color="#2ca02c")


def lines_figure(series: dict[str, tuple[list, list]], *, title: str, x_title: str, y_title: str,
                 height: int = 320, y_range: list[float] | None = None) -> dict:
    if not series or not any(xs for xs, _ in series.values()):
        return empty_figure("No data yet.", title=title)
    data = [go.Scatter(x=xs, y=ys, name=plain(name), mode="lines") for name, (xs, ys) in series.items()]
    yaxis = {"title": {"text": y_title}}
    if y_range is not None:
        yaxis["range"] = y_range
    fig = go.Figure(data=data, layout=_layout(title={"text": title}, height=height,
                                              xaxis={"title": {"text": x_title}}, yaxis=yaxis,
                                              legend={"orientation": "h", "y": -0.3, "font": {"size": 10}},
                                              margin={"l": 60, "r": 20, "t": 40, "b": 80}))
    return figure_dict(fig)


def fill_fragmentation_figure(policies: list[tuple[str, dict]]) -> dict:
    """Fill method (ATC'23): unallocated and fragmented GPUs as the arrived request grows, per policy."""
    series = {}
    for name, result in policies:
        curve = result.get("curve") or []
        xs = [p.get("arrived_share") for p in curve]
        series[f"{name} unallocated"] = (xs, [p.get("unallocated_gpus") for p in curve])
        if any(p.get("frag_gpus") is not None for p in curve):
            series[f"{name} fragmented"] = (xs, [p.get("frag_gpus") for p in curve])
    return lines_figure(series, title="Unallocated and fragmented GPUs vs arrived request",
                        x_title="arrived request (share of capacity)", y_title="GPUs")
