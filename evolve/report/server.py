"""`evolve serve`: the report's views as a live, read-only page (Flask on werkzeug's threaded server).

The aggregated payload is cached per run and rebuilt only when the archive's change key moves, so a page
polling every few seconds costs a handful of indexed MAX() queries while nothing is written.
"""

from __future__ import annotations

import threading
from contextlib import suppress
from typing import Any

from flask import Flask, Response, abort, jsonify, request
from plotly.offline import get_plotlyjs
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from evolve.archive import Archive, ArchiveError, RunRecord
from evolve.archive.progress import published_sampling
from evolve.report import queries
from evolve.report.page import LINEAGE_STEPS, REFRESH_S, payload, render, safe_json

SAMPLING_STALE_S = 30.0  # a run writes its sampling progress every 2 s; older than this, it is gone


class PayloadCache:
    """The aggregated payload per run, rebuilt in the background when the archive moves.

    A request never waits for an aggregation once a payload exists: it gets the held one while a single
    background thread builds the next (stale-while-revalidate), so polling pages and first paints stay fast
    at 100k programs. Only the very first build of a run is synchronous; `warm` does it before serving.
    """

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self._lock = threading.Lock()
        self._held: dict[int, tuple[str, dict[str, Any]]] = {}
        self._building: set[int] = set()

    def _build(self, run: RunRecord, key: str) -> dict[str, Any]:
        fresh = {**payload(self.archive, run, with_details=False), "key": key}
        with self._lock:
            self._held[run.id] = (key, fresh)
            self._building.discard(run.id)
        return fresh

    def warm(self, run: RunRecord) -> None:
        self._build(run, repr(queries.change_key(self.archive, run.id)))

    def get(self, run: RunRecord) -> dict[str, Any]:
        key = repr(queries.change_key(self.archive, run.id))
        with self._lock:
            held = self._held.get(run.id)
            if held is not None and (held[0] == key or run.id in self._building):
                return held[1]
            if held is not None:
                self._building.add(run.id)
        if held is None:
            return self._build(run, key)
        threading.Thread(target=self._build, args=(run, key), daemon=True).start()
        return held[1]


def create_app(archive: Archive, default_run: int, refresh_s: float = REFRESH_S) -> Flask:
    """The dashboard's routes; the default run's payload is built before the app is returned. The page asks
    for fresh data every `refresh_s`."""
    app = Flask("evolve.report")
    cache = PayloadCache(archive)
    with suppress(ArchiveError):  # a run that is not there answers 404 below
        first = archive.find_run(default_run)
        if first is not None:
            cache.warm(first)
    plotly_js = get_plotlyjs()

    def chosen_run() -> RunRecord:
        wanted = request.args.get("run", default=default_run, type=int)
        try:
            run = archive.find_run(wanted)
        except ArchiveError:
            run = None
        if run is None:
            abort(404, f"no run {wanted}")
        return run

    @app.get("/")
    def page() -> Response:
        run = chosen_run()
        return Response(render(cache.get(run), live=True, run_id=run.id, refresh_s=refresh_s), mimetype="text/html")

    @app.get("/plotly.js")
    def plotly() -> Response:
        response = Response(plotly_js, mimetype="application/javascript")
        response.cache_control.max_age = 86400
        return response

    @app.get("/api/data")
    def data() -> Response:
        run = chosen_run()
        fresh = cache.get(run)
        if request.args.get("key") == fresh["key"]:
            return Response(status=204)
        return Response(safe_json(fresh), mimetype="application/json")

    @app.get("/api/sampling")
    def sampling() -> Response:
        """The group the run is sampling (as the run's live view shows it), or an empty line between groups,
        once the run has stopped, or when the run last wrote longer ago than a live run would."""
        run = chosen_run()
        published = published_sampling(archive, run.id)
        live = published is not None and published.age_s <= SAMPLING_STALE_S and _running(archive, run.id)
        return jsonify({"line": published.line() if live and published is not None else ""})

    @app.get("/api/program/<int:program_id>")
    def program(program_id: int) -> Response:
        detail = queries.program_detail(archive, program_id)
        if detail is None:
            abort(404, f"no program {program_id}")
        return Response(safe_json(detail), mimetype="application/json")

    @app.get("/api/lineage/<int:program_id>")
    def lineage(program_id: int) -> Response:
        nodes = archive.ancestry([program_id], LINEAGE_STEPS)
        if not nodes:
            abort(404, f"no program {program_id}")
        return jsonify([vars(n) for n in nodes])

    @app.after_request
    def headers(response: Response) -> Response:
        # Read-only dashboard: nothing may frame it, and the browser must not guess types of program text.
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        return response

    return app


def _running(archive: Archive, run_id: int) -> bool:
    return any(r.id == run_id and r.status == "running" for r in archive.runs())


def make_dashboard(archive: Archive, run_id: int, host: str, port: int, refresh_s: float = REFRESH_S) -> BaseWSGIServer:
    """A threaded server bound to (host, port); port 0 picks a free one (see `.server_port`)."""
    app = create_app(archive, run_id, refresh_s)
    return make_server(host, port, app, threaded=True, request_handler=QuietHandler)


class QuietHandler(WSGIRequestHandler):
    """No line per request: a page polling every few seconds would bury the terminal."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass
