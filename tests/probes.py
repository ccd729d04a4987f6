"""Problems whose score vector is what the candidate measured: one component per probe, scored as the number
the candidate returned for it, so tests assert exact numbers rather than search a feedback text."""

from __future__ import annotations

from pathlib import Path

PROBE_EVALUATE = """
def cases():
    return [{"name": p, "input": p} for p in PROBES]

def score(case, output):
    return float(output)
"""


def probe_problem(root: Path, probes: tuple[str, ...], timeout_s: float = 20, memory_mb: int = 512) -> Path:
    """A split-form problem with one case and one component per probe; a failed case scores -1."""
    components = ", ".join(f'{{ name = "{p}", direction = "minimize", fail_value = -1.0 }}' for p in probes)
    root.mkdir(parents=True, exist_ok=True)
    (root / "problem.toml").write_text(
        f'name = "probe"\ndescription = "What a candidate measured."\n[program]\nfile = "seed.py"\n'
        f"[fitness]\ncomponents = [{components}]\n[limits]\ntimeout_s = {timeout_s}\nmemory_mb = {memory_mb}\n"
    )
    (root / "evaluate.py").write_text(PROBE_EVALUATE.replace("PROBES", repr(probes)))
    (root / "seed.py").write_text("def solve(what):\n    return 0\n")
    return root


def constant_program(values: dict[str, float]) -> str:
    """A known program: it answers `values[probe]` for each probe."""
    return f"def solve(what):\n    return {values!r}[what]\n"
