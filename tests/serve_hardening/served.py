"""`evolve serve` on an archive of known programs, and the server's documented bounds the tests hold it to."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from evolve.archive import Archive
from evolve.options import RunOptions
from evolve.problem import load_problem
from evolve.runs import open_run
from tests.helpers import KNOWN, store_program, write_square_problem

HUGE = "99999999999999999999999999"  # past SQL's 64-bit integers: the driver cannot even bind it
ZERO = {"scores": {"c0": 0.0, "c1": 0.0}, "scalar": 0.0, "duration_s": 0.1}  # what a wrong program scores
CAP, IDLE_S = 64, 10.0  # the server's documented bounds: connections served at once, seconds a read may wait
HEAD_S = 15.0  # the server's documented bound on the seconds a request's head may take to arrive, whatever trickles


def known_archive(location: str, root: Path) -> list[tuple[int, str, dict[str, float]]]:
    """A run of the square problem holding the known programs, each with its exact vector; (id, code, vector)."""
    archive = Archive(location)
    problem = load_problem(write_square_problem(root / "square"))
    run = open_run(archive, problem, RunOptions.for_problem(problem.config.search, policy="embedded")).run
    known = []
    for code, vector in KNOWN:
        scalar = sum(vector.values()) / len(vector)
        evaluation = {"scores": vector, "scalar": scalar, "duration_s": 0.1}
        pid, _ = store_program(archive, run.id, code, evaluation=evaluation)
        known.append((pid, code, vector))
    archive.close()
    return known


def assert_honest(url: str, known: list[tuple[int, str, dict[str, float]]], **headers: str) -> None:
    """Every known program reads back with its exact code and score vector."""
    for pid, code, vector in known:
        answer = httpx.get(f"{url}/api/program/{pid}", headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["code"], answer.json()["scores"]) == (code, vector)


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str]

    def output(self) -> str:
        return "".join(self.lines)


def start_serve(db: str, *extra: str) -> Served:
    """`evolve serve DB --port 0` in its own process; its output is collected as it comes (the pipe never fills)."""
    cmd = [sys.executable, "-m", "evolve.cli", "serve", db, "--port", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while not any("serving run" in line for line in lines):
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line and time.monotonic() < deadline, f"evolve serve exited before listening: {''.join(lines)}"
        lines.append(line)
    url = lines[-1].split(" at ")[1].split()[0].rstrip("/")
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]
    return Served(proc, url, lines)
