"""Plotly figures for the aggregated views. Only numbers and fixed labels go into a figure, never program
text: plotly renders some markup in labels, so untrusted strings stay out of it altogether."""

from __future__ import annotations

import itertools
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from evolve.report.aggregate import STAT_KEYS, Steps, Views

HEIGHT = 340
BARE = {"template": {}}  # the page sends one template for all figures; plotly's default costs seconds each


def _figure(data: Any = None) -> go.Figure:
    return go.Figure(data=data, layout=BARE)


def _subplots(rows: int) -> go.Figure:
    return make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.08, figure=_figure())


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = HEIGHT) -> dict[str, Any]:
    """The figure's JSON with titles and size set on the plain dict (plotly's layout validation is slow)."""
    out = fig.to_plotly_json()
    layout = out["layout"]
    layout.pop("template", None)
    layout.update(
        title={"text": title},
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.25},
    )
    bottom = max((k for k in layout if k.startswith("xaxis")), key=lambda k: int(k[5:] or 1), default="xaxis")
    layout.setdefault(bottom, {})["title"] = {"text": x}
    if y:
        layout.setdefault("yaxis", {})["title"] = {"text": y}
    return out


def _steps_trace(name: str, steps: Steps, x: str, width: float) -> go.Scatter:
    return go.Scatter(
        x=steps.x_eval if x == "eval" else steps.x_time,
        y=steps.y,
        customdata=steps.ids,
        name=name,
        mode="lines+markers",
        line={"shape": "hv", "width": width},
        marker={"size": 5},
        hovertemplate="%{y:.6g} at %{x}<br>program %{customdata}<extra>" + name + "</extra>",
    )


def progress_figure(views: Views, x: str) -> dict[str, Any] | None:
    if not views.progress["all"].y:
        return None
    fig = _figure()
    for name, steps in views.progress.items():
        if steps.y:
            fig.add_trace(_steps_trace(name, steps, x, 3 if name == "all" else 1.5))
    if x == "time":
        out = _layout(fig, "Best scalar over wall-clock time (dotted: policy updates)", "seconds since start", "best")
        updates = [v for v in views.versions if v["number"] > 0]
        out["layout"]["shapes"] = [
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": v["t"],
                "x1": v["t"],
                "y0": 0,
                "y1": 1,
                "line": {"dash": "dot", "color": "#888"},
            }
            for v in updates
        ]
        out["layout"]["annotations"] = [
            {
                "x": v["t"],
                "xref": "x",
                "y": 1,
                "yref": "paper",
                "text": f"v{v['number']}",
                "showarrow": False,
                "yanchor": "bottom",
            }
            for v in updates
        ]
        return out
    return _layout(fig, "Best scalar over evaluations, overall and per island", "evaluations", "best scalar")


def components_figure(views: Views, x: str) -> dict[str, Any] | None:
    """Each component's best, overall; a menu (plotly's own) switches to one island's curves."""
    groups = {"overall": views.components, **views.island_components}
    fig = _figure()
    owners: list[str] = []
    for group, curves in groups.items():
        for name, steps in curves.items():
            if steps.y:
                fig.add_trace(_steps_trace(name, steps, x, 1.5))
                fig.data[-1].visible = group == "overall"
                fig.data[-1].legendgroup = name
                owners.append(group)
    if not fig.data:
        return None
    title = "Each component's best over " + ("evaluations" if x == "eval" else "wall-clock time")
    out = _layout(fig, title, "evaluations" if x == "eval" else "seconds since start", "best value")
    out["layout"]["updatemenus"] = [
        {
            "type": "dropdown",
            "x": 1.0,
            "xanchor": "right",
            "y": 1.18,
            "yanchor": "top",
            "showactive": True,
            "buttons": [
                {"label": group, "method": "restyle", "args": [{"visible": [o == group for o in owners]}]}
                for group in groups
                if group in owners
            ],
        }
    ]
    return out


def grid_figures(views: Views) -> list[dict[str, Any]]:
    out = []
    for grid in views.grids:
        fig = _figure(
            go.Heatmap(
                x=grid["x"],
                y=grid["y"],
                z=grid["z"],
                customdata=grid["ids"],
                colorscale="Viridis",
                hovertemplate="cell (%{x}, %{y})<br>best scalar %{z:.6g}<br>program %{customdata}<extra></extra>",
            )
        )
        out.append(
            _layout(
                fig,
                f"Island {grid['island']}: {grid['elites']} elites",
                f"{grid['x_name']} bin",
                f"{grid['y_name']} bin" if grid["y_name"] else "",
                height=300,
            )
        )
    return out


def _stacked(counts: dict[str, list[int]], edges: list[float], title: str, y: str) -> dict[str, Any] | None:
    if not any(sum(c) for c in counts.values()):
        return None
    centers = [(a + b) / 2 for a, b in itertools.pairwise(edges)]
    fig = _figure([go.Bar(x=centers, y=c, name=label) for label, c in counts.items()])
    fig.update_layout(barmode="stack", bargap=0.05)
    return _layout(fig, title, "seconds since start", y)


def errors_figure(views: Views) -> dict[str, Any] | None:
    return _stacked(views.errors["counts"], views.errors["t"], "Evaluations by outcome (error kind) over time", "count")


def parse_figure(views: Views) -> dict[str, Any] | None:
    return _stacked(views.parse["counts"], views.parse["t"], "Parse outcomes of answers over time", "answers")


def throughput_figure(views: Views) -> dict[str, Any] | None:
    tp = views.throughput
    if not any(tp["evals_per_min"]):
        return None
    series = [("evaluations/min", tp["evals_per_min"])]
    if tp["has_tokens"]:  # replay and some HTTP backends report no token ids: then no token rates at all
        series = [
            ("tokens/s", tp["tokens_per_s"]),
            *series,
            ("unique valid children per 1k tokens", tp["valid_per_1k_tokens"]),
        ]
    fig = _subplots(len(series))
    for row, (name, values) in enumerate(series, 1):
        fig.add_trace(go.Scatter(x=tp["t"], y=values, name=name, mode="lines+markers", marker={"size": 4}), row, 1)
        fig.update_yaxes(title_text=name.split(" per ")[0], row=row, col=1)
    title = "Throughput" if tp["has_tokens"] else "Throughput (the policy reported no token ids, so no token rates)"
    return _layout(fig, title, "seconds since start", "", height=180 + 170 * len(series))


def policy_figure(views: Views) -> dict[str, Any] | None:
    versions = views.versions
    if not versions or not any(v["best_child"] is not None or v["loss"] is not None for v in versions):
        return None
    t = [v["t"] for v in versions]
    labels = [f"v{v['number']}" for v in versions]
    stats = [(key, [v[key] for v in versions]) for key in STAT_KEYS]
    stats = [(key, values) for key, values in stats if any(value is not None for value in values)]
    rows = 2 if stats else 1
    fig = _subplots(rows)
    for key, values in stats:
        fig.add_trace(go.Scatter(x=t, y=values, text=labels, name=key, mode="lines+markers"), 1, 1)
    fig.add_trace(
        go.Scatter(
            x=t,
            y=[v["best_child"] for v in versions],
            text=labels,
            name="best child scalar",
            mode="markers+text",
            textposition="top center",
            marker={"size": 10, "symbol": "diamond"},
        ),
        rows,
        1,
    )
    if stats:
        fig.update_yaxes(title_text="update statistics", row=1, col=1)
    fig.update_yaxes(title_text="best child", row=rows, col=1)
    title = "Policy versions: update statistics and the best child each version wrote"
    return _layout(
        fig, title if stats else title + " (no update yet)", "seconds since start", "", height=260 + 220 * rows
    )


def all_figures(views: Views) -> dict[str, Any]:
    """name → figure JSON, or None where the run holds no data for that view yet."""
    return {
        "best_eval": progress_figure(views, "eval"),
        "best_time": progress_figure(views, "time"),
        "components_eval": components_figure(views, "eval"),
        "components_time": components_figure(views, "time"),
        "grids": grid_figures(views),
        "errors": errors_figure(views),
        "parse": parse_figure(views),
        "throughput": throughput_figure(views),
        "policy": policy_figure(views),
    }
