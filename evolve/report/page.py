"""Assemble the page: one payload (figures, Pareto data, lineage), one template, one script.

The payload is embedded as JSON inside <script type="application/json"> with <, > and & written as \\u
escapes, so no string in it (program code, feedback) can close the script element. The page's script
puts program text into the document with textContent only.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import cache
from importlib.resources import files
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from plotly.offline import get_plotlyjs
from plotly.utils import PlotlyJSONEncoder

from evolve.archive import Archive, RunRecord
from evolve.fitness import signs
from evolve.report import queries
from evolve.report.aggregate import run_components
from evolve.report.build import build_views
from evolve.report.figures import all_figures
from evolve.yields import worst_values

LINEAGE_STEPS = 100  # ancestors walked per lineage root
REFRESH_S = 5.0  # how often the live page asks for fresh data (the browser test asks every second)


def safe_json(value: Any) -> str:
    text = json.dumps(value, cls=PlotlyJSONEncoder, separators=(",", ":"))
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def lineage_payload(archive: Archive, roots: list[int]) -> list[dict[str, Any]]:
    return [asdict(n) for n in archive.ancestry(roots, LINEAGE_STEPS)]


def payload(archive: Archive, run: RunRecord, *, with_details: bool) -> dict[str, Any]:
    """What the page draws. The self-contained report also carries each lineage node's detail."""
    views = build_views(archive, run)
    specs = run_components(run)  # their directions and worst values decide which children scored nothing
    nodes = lineage_payload(archive, views.lineage_roots)
    data: dict[str, Any] = {
        "meta": views.meta,
        "figures": all_figures(views),
        "pareto": views.pareto,
        "lineage": {"roots": views.lineage_roots, "nodes": nodes},
        "details": {},
        "template": _template(),
        "arms": archive.arms(run.id, signs(specs), worst_values(specs)),  # per member and ask (evolve.archive.arms)
    }
    if with_details:
        data["details"] = {str(n["id"]): queries.program_detail(archive, n["id"]) for n in nodes}
    return data


@cache
def _template() -> dict[str, Any]:
    """One plotly template for every figure, sent once (validating it per figure costs seconds)."""
    import plotly.io as pio

    return pio.templates["plotly_white"].to_plotly_json()


@cache
def _environment() -> Environment:
    return Environment(loader=PackageLoader("evolve.report", "templates"), autoescape=select_autoescape(["html"]))


def _script() -> str:
    return files("evolve.report").joinpath("templates/report.js").read_text()


def render(data: dict[str, Any], *, live: bool, run_id: int, refresh_s: float = REFRESH_S) -> str:
    """The HTML page. Static: plotly.js inlined, so it opens with no network. Live: plotly.js from the server,
    and fresh data every `refresh_s`."""
    template = _environment().get_template("report.html")
    return template.render(
        meta=data["meta"],
        data_json=safe_json(data),
        plotly_js=None if live else get_plotlyjs(),
        script=_script(),
        live=live,
        run_id=run_id,
        refresh_ms=round(refresh_s * 1000),
    )


def write_report(archive: Archive, run: RunRecord) -> str:
    return render(payload(archive, run, with_details=True), live=False, run_id=run.id)
