"""`evolve serve`: the report's views as a live, read-only page (Flask on werkzeug's threaded server).

The aggregated payload is cached per run and rebuilt only when the archive's change key moves, so a page
polling every few seconds costs a handful of indexed MAX() queries while nothing is written.

The page is meant for the person who started it: it answers only requests that name the address it serves
(a page of another site that has its name resolve to this address, DNS rebinding, is refused), and it bounds
what slow or idle clients can hold (connections served at once, seconds a read may wait, seconds a request may
take to arrive however it trickles).
"""

from __future__ import annotations

import io
import ipaddress
import logging
import socket
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, abort, jsonify, request
from plotly.offline import get_plotlyjs
from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from evolve.archive import Archive, ArchiveError, RunRecord
from evolve.archive.database import ArchiveDamaged
from evolve.archive.progress import published_sampling
from evolve.report import queries
from evolve.report.page import LINEAGE_STEPS, REFRESH_S, payload, render, safe_json

SAMPLING_STALE_S = 30.0  # a run writes its sampling progress every 2 s; older than this, it is gone
ROW_ID_MAX = 2**63 - 1  # SQL's largest integer: no row has a larger id, and the driver cannot bind one
READ_TIMEOUT_S = 10.0  # a connection that sends nothing for this long is closed (werkzeug closes after each answer)
REQUEST_DEADLINE_S = 15.0  # a request (head, and any body) must have arrived this long after it began, bytes or not
MAX_CONNECTIONS = 64  # served at once; past it a connection is answered 503 at once, with no thread of its own
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})

log = logging.getLogger("evolve.report.server")


class PayloadUnavailable(Exception):
    """No payload of the run could be built (the build failed); the message is one line saying why."""


@dataclass
class _Build:
    """One build of a run's payload in flight: requests that have nothing to show wait for it."""

    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class PayloadCache:
    """The aggregated payload per run, rebuilt in the background when the archive moves.

    A request never waits for an aggregation once a payload exists: it gets the held one while a single
    background thread builds the next (stale-while-revalidate), so polling pages and first paints stay fast
    at 100k programs. A run's first build is made by the first request that asks for it; requests that come
    while it runs wait for that one build rather than each making their own. `warm` makes it before serving.

    A build that fails (a dropped connection, a locked read) leaves nothing in flight: the held payload is
    served still, and the next request whose change key has moved starts another build.
    """

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self._lock = threading.Lock()
        self._held: dict[int, tuple[str, dict[str, Any]]] = {}
        self._builds: dict[int, _Build] = {}

    def _build(self, run: RunRecord, key: str, build: _Build) -> None:
        try:
            fresh = {**payload(self.archive, run, with_details=False), "key": key}
            with self._lock:
                self._held[run.id] = (key, fresh)
        except Exception as exc:  # any failure of the archive's driver: the report layer may not name its types
            said = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, whatever the driver wrote
            build.error = "".join(c if c.isprintable() else "?" for c in said)
            log.warning(
                "evolve serve: run %d's page could not be rebuilt (%s); trying again on the next request",
                run.id,
                build.error,
            )
        finally:
            with self._lock:
                self._builds.pop(run.id, None)
            build.done.set()

    def warm(self, run: RunRecord) -> None:
        """Build the run's first payload now; a failure is left for the first request to report."""
        with suppress(PayloadUnavailable):
            self.get(run)

    def get(self, run: RunRecord) -> dict[str, Any]:
        """The run's payload: current, or the held one while the next is built; `PayloadUnavailable` when the
        run has none and its build failed."""
        key = repr(queries.change_key(self.archive, run.id))
        with self._lock:
            held = self._held.get(run.id)
            if held is not None and held[0] == key:
                return held[1]
            build = self._builds.get(run.id)
            lead = build is None
            if build is None:
                build = self._builds[run.id] = _Build()
        if held is not None:
            if lead:
                try:
                    threading.Thread(target=self._build, args=(run, key, build), daemon=True).start()
                except RuntimeError:  # no thread to be had: build in this request rather than leave one pending
                    self._build(run, key, build)
            return held[1]
        if lead:
            self._build(run, key, build)
        else:
            build.done.wait()
        with self._lock:
            held = self._held.get(run.id)
        if held is None:
            raise PayloadUnavailable(f"run {run.id}: its page could not be built ({build.error}); reload to try again")
        return held[1]


def host_name(host: str) -> str:
    """The name part of a Host header, lower case: `[::1]:8000` gives `::1`, `LocalHost:80` gives `localhost`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if ":" in host else host


def host_allowed(name: str, bound: str) -> bool:
    """Whether a request naming `name` is meant for a server bound to `bound`: a loopback name or the bound
    address itself. Bound to every interface, any address literal and this machine's own name too: a
    rebinding page always names its own domain, never an address."""
    served = host_name(bound) if bound.startswith("[") else bound.lower()
    if name in LOOPBACK_NAMES or name == served:
        return True
    if served not in WILDCARDS:
        return False
    with suppress(ValueError):
        ipaddress.ip_address(name)
        return True
    return name in {socket.gethostname().lower(), socket.getfqdn().lower()}


def row_id(text: str) -> int | None:
    """A run or program id given as text, or None when no row can have it (not a whole number, out of range)."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if 1 <= value <= ROW_ID_MAX else None


def create_app(archive: Archive, default_run: int, refresh_s: float = REFRESH_S, host: str = "127.0.0.1") -> Flask:
    """The dashboard's routes; the default run's payload is built before the app is returned. The page asks
    for fresh data every `refresh_s`; requests that name another host than `host` (or loopback) get 421."""
    app = Flask("evolve.report")
    cache = PayloadCache(archive)
    with suppress(ArchiveError):  # a run that is not there answers 404 below
        first = archive.find_run(default_run)
        if first is not None:
            cache.warm(first)
    plotly_js = get_plotlyjs()
    ids = f"int(min=1, max={ROW_ID_MAX})"  # an id no row can have is a 404 here, not an overflow in the driver

    def chosen_run() -> RunRecord:
        given = request.args.get("run")
        wanted = default_run if given is None else row_id(given)
        if wanted is None:
            abort(404, f"no run {given!r}: run ids are whole numbers from 1 to {ROW_ID_MAX}")
        try:
            run = archive.find_run(wanted)
        except ArchiveDamaged:
            raise  # answered 503 below: the run may well be there, once the file is restored
        except ArchiveError:
            run = None
        if run is None:
            abort(404, f"no run {wanted}")
        return run

    @app.before_request
    def addressed_here() -> Response | None:
        if host_allowed(host_name(request.host), host):
            return None
        names = ", ".join(dict.fromkeys([host, "127.0.0.1", "localhost", "[::1]"]))
        said = f"this dashboard answers only requests addressed to it by name: {names}; open it by one of those\n"
        return Response(said, status=421, mimetype="text/plain")

    @app.errorhandler(PayloadUnavailable)
    def unavailable(exc: PayloadUnavailable) -> Response:
        return Response(f"{exc}\n", status=503, mimetype="text/plain")

    logged: set[str] = set()  # the damage lines said in the terminal once each, not once per polling request

    @app.errorhandler(ArchiveDamaged)
    def damaged(exc: ArchiveDamaged) -> Response:
        """Any route, while the file is damaged: the archive's one line (what is wrong, how to restore it); the
        next request reads the file anew, so a restored one is served at once."""
        said = " ".join(str(exc).split())
        if said not in logged:
            logged.add(said)
            log.warning("evolve serve: %s", said)
        return Response(f"{said}\n", status=503, mimetype="text/plain")

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

    @app.get(f"/api/program/<{ids}:program_id>")
    def program(program_id: int) -> Response:
        detail = queries.program_detail(archive, program_id)
        if detail is None:
            abort(404, f"no program {program_id}")
        return Response(safe_json(detail), mimetype="application/json")

    @app.get(f"/api/lineage/<{ids}:program_id>")
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


def make_dashboard(
    archive: Archive, run_id: int, host: str, port: int, refresh_s: float = REFRESH_S
) -> DashboardServer:
    """A threaded server bound to (host, port); port 0 picks a free one (see `.server_port`). An OSError when it
    cannot listen there."""
    app = create_app(archive, run_id, refresh_s, host)
    try:
        return DashboardServer(host, port, app)
    except _BindFailed as failed:
        raise failed.error from None


class _BindFailed(Exception):
    """Carries a bind's OSError past werkzeug, which would print it and exit the process with status 1."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


_BUSY_TEXT = b"too many connections to this dashboard at once; try again in a few seconds\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 5\r\nConnection: close\r\n"
    + b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)


class DashboardServer(ThreadedWSGIServer):
    """werkzeug's threaded server, bounded: at most `MAX_CONNECTIONS` connections hold a thread; one more is
    answered 503 from the accepting thread and closed, so a crowd of slow clients cannot grow the process
    without limit. Each read waits `READ_TIMEOUT_S` at most (`QuietHandler`), so a held slot is given back."""

    def __init__(self, host: str, port: int, app: Flask, max_connections: int = MAX_CONNECTIONS) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(host, port, app, handler=QuietHandler)

    def server_bind(self) -> None:
        try:
            super().server_bind()
        except OSError as exc:
            raise _BindFailed(exc) from exc

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with suppress(OSError):
                request.setblocking(False)  # the accepting thread never waits on a client
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _DeadlineReads(io.RawIOBase):
    """The connection's incoming bytes, each read waiting `idle_s` at most and ending no later than `deadline`
    (a `time.monotonic()` value, or None for no deadline). The per-read wait alone cannot bound a client that
    sends one byte just inside it, again and again: the deadline does, whatever trickles."""

    def __init__(self, sock: socket.socket, idle_s: float) -> None:
        super().__init__()
        self._sock = sock
        self._idle_s = idle_s
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wait = self._idle_s
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError(f"the request took longer than {REQUEST_DEADLINE_S:g} s to arrive")
        self._sock.settimeout(wait)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._idle_s)  # the answer's writes wait as long as ever


class QuietHandler(WSGIRequestHandler):
    """No line per request: a page polling every few seconds would bury the terminal. A read that waits
    longer than `timeout` ends the connection (a client that opened it and sent nothing, or half a request),
    silently too: a browser leaves such connections behind. So does a request that has not arrived
    `REQUEST_DEADLINE_S` after it began (a slow-loris client trickling a byte at a time holds no slot longer)."""

    timeout = READ_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the plain reader holds a reference on the socket, which would keep it open
        self._reads = _DeadlineReads(self.connection, READ_TIMEOUT_S)
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        self._reads.deadline = time.monotonic() + REQUEST_DEADLINE_S  # each request of a kept-alive connection
        super().handle_one_request()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass

    def log_error(self, format: str, *args: Any) -> None:
        if not format.startswith("Request timed out"):
            super().log_error(format, *args)
