"""The HTML report and the live dashboard, opened in a real headless Chromium as a person would."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import store_program
from tests.report_run import HOSTILE, add_policy_update, make_report_run
from tests.services import missing

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWS = {
    "best_eval",
    "best_time",
    "components_eval",
    "components_time",
    "pareto",
    "lineage",
    "errors",
    "parse",
    "throughput",
    "policy",
}


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("Chromium", "playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).exists():
        missing("Chromium", f"no {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def archive_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = make_report_run(tmp_path_factory.mktemp("report"))
    add_policy_update(db)
    return db


class Visit:
    """A page plus everything it said: console messages, uncaught errors, dialogs (alert() would be one)."""

    def __init__(self, browser: object, url: str) -> None:
        self.page = browser.new_page(viewport={"width": 1300, "height": 900})  # type: ignore[attr-defined]
        self.console: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(url)
        self.page.wait_for_selector("body[data-ready=true]", timeout=60_000)

    def plots(self) -> dict[str, list[int]]:
        """Each drawn plot (grids by position) → number of data points per trace."""
        return self.page.evaluate(
            """() => Object.fromEntries(Array.from(document.querySelectorAll('.js-plotly-plot')).map((el, i) =>
                 [el.id || 'grid' + i, el.data.map(t => (t.z || t.x || []).filter(v => v !== null).length)]))"""
        )

    def click_lineage_node(self, program_id: int) -> None:
        """Click the node's marker where it is drawn, as a mouse would."""
        box = self.page.evaluate(
            """(pid) => {
                 const el = document.getElementById('lineage');
                 const trace = el.data.findIndex(t => t.customdata && t.customdata.includes(pid));
                 const k = el.data[trace].customdata.indexOf(pid);
                 const pt = el.querySelectorAll('.scatterlayer .trace')[trace].querySelectorAll('.point')[k];
                 pt.scrollIntoView({block: 'center'});
                 const r = pt.getBoundingClientRect();
                 return [r.x + r.width / 2, r.y + r.height / 2];
               }""",
            program_id,
        )
        self.page.mouse.move(box[0], box[1])
        self.page.mouse.click(box[0], box[1])


def program_codes(db: Path) -> dict[int, str]:
    from evolve.archive import Archive

    archive = Archive(db, create=False)
    run = archive.runs()[-1]
    codes = archive.codes([p.id for p in archive.scored_programs(run.id)])
    archive.close()
    return codes


def check_page(visit: Visit, db: Path) -> None:
    plots = visit.plots()
    assert set(plots) >= VIEWS, f"views not drawn: {VIEWS - set(plots)}"
    assert any(k.startswith("grid") for k in plots), "no MAP-Elites grid drawn"
    empty = {name: points for name, points in plots.items() if not points or sum(points) == 0}
    assert not empty, f"plots without data points: {empty}"
    assert visit.page.locator("p.note").count() == 0, visit.page.locator("p.note").all_inner_texts()

    codes = program_codes(db)
    hostile_id = next(pid for pid, code in codes.items() if HOSTILE in code)
    seed_id = min(codes)
    visit.click_lineage_node(seed_id)
    visit.page.wait_for_function(f"document.getElementById('program').dataset.program === '{seed_id}'")
    assert visit.page.inner_text("#program-code").strip() == codes[seed_id].strip()

    visit.click_lineage_node(hostile_id)
    shown = f"document.getElementById('program').dataset.program === '{hostile_id}'"
    try:
        visit.page.wait_for_function(shown, timeout=5000)
    except Exception:  # another node drawn over it took the mouse's click: send the click to its point instead
        visit.page.evaluate(
            """(pid) => {
                 const el = document.getElementById('lineage');
                 const trace = el.data.findIndex(t => t.customdata && t.customdata.includes(pid));
                 el.emit('plotly_click', {points: [{customdata: pid, curveNumber: trace}]});
               }""",
            hostile_id,
        )
        visit.page.wait_for_function(shown)
    assert HOSTILE in visit.page.inner_text("#program-code")  # shown as text ...
    assert HOSTILE in visit.page.inner_text("#program-errors")  # ... its stdout too
    assert HOSTILE in visit.page.inner_text("#program-diff")
    assert visit.page.locator("script").count() == 3  # ... and no element was made of it
    assert visit.dialogs == []
    assert visit.console == []


def test_report_file_in_chromium(browser: object, archive_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    cmd = [sys.executable, "-m", "evolve.cli", "report", str(archive_db), "--html", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert HOSTILE not in html
    visit = Visit(browser, out.as_uri())
    check_page(visit, archive_db)
    assert [url for url in visit.requests if not url.startswith("file:")] == []  # self-contained: no network


def test_live_dashboard_in_chromium_refreshes(browser: object, archive_db: Path, tmp_path: Path) -> None:
    from evolve.archive import Archive
    from evolve.report.server import make_dashboard

    db = tmp_path / "live.db"
    shutil.copy(archive_db, db)
    archive = Archive(db, create=False)
    run = archive.runs()[-1]
    server = make_dashboard(archive, run.id, "127.0.0.1", 0, refresh_s=1.0)  # the test waits for a poll: 1 s, not 5
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        visit = Visit(browser, f"http://127.0.0.1:{server.server_port}/")
        check_page(visit, db)
        before = visit.page.inner_text("#summary")
        writer = Archive(db, create=False)  # the run goes on: a new best lands while the page is open
        seed = min(program_codes(db))
        new_id, _ = store_program(
            writer,
            run.id,
            "def solve(x):\n    return x ** 2\n",
            parent_id=seed,
            generation=1,
            evaluation={"scores": {"c0": 1.0, "c1": 1.0}, "scalar": 1.5, "duration_s": 0.1, "sandbox": "process"},
        )
        writer.close()
        visit.page.wait_for_function(
            f"document.getElementById('summary').textContent.includes('program {new_id}')", timeout=30_000
        )
        assert visit.page.inner_text("#summary") != before
        assert visit.console == [] and visit.dialogs == []
    finally:
        server.shutdown()
        thread.join(timeout=10)
        archive.close()
