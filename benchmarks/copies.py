"""Why does the model write copies? Every variant of an archive by status, and each duplicate by what it copied.

A duplicate variant names the archived program it repeats (`variants.program_id`). That program is one of:
- the prompt's own inspiration (the example program shown beside the parent), copied back;
- an earlier child of the same parent (the prompt shows the parent's recent children, asking for others);
- the parent itself, once normalised (layout and local names do not count);
- any other program of the archive;
- or none yet: a child that a sibling completion of the same group made moments before, not yet stored.

Usage: python -m benchmarks.copies DB [DB ...]   (ends with `copies variants=... duplicates=... inspiration=...`)
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import Counter
from pathlib import Path

KIND = "analysis"
SMOKE_ARGS = ("{study}/arms/minimizer-s0-none/arm.db",)

CAUSES = ("inspiration", "parent's child", "parent", "other", "same group")


def causes(db: Path) -> tuple[Counter[str], Counter[str], int, int]:
    """(variants by status, duplicates by cause, completions, completions cut at the token budget) of one archive."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT v.status, v.program_id, p.id, p.parent_id, p.inspiration_ids FROM variants v "
            "JOIN completions c ON c.id = v.completion_id JOIN prompts p ON p.id = c.prompt_id ORDER BY v.id"
        ).fetchall()
        parents = dict(con.execute("SELECT id, parent_id FROM programs").fetchall())
        completions, cut = con.execute("SELECT count(*), sum(finish_reason = 'length') FROM completions").fetchone()
    finally:
        con.close()
    statuses: Counter[str] = Counter()
    found: Counter[str] = Counter()
    for status, program, _prompt, parent, inspirations in rows:
        statuses[status] += 1
        if status != "duplicate":
            continue
        shown = set(json.loads(inspirations) if isinstance(inspirations, str) else inspirations or [])
        if program is None:
            found["same group"] += 1
        elif program in shown:
            found["inspiration"] += 1
        elif program == parent:
            found["parent"] += 1
        elif parents.get(program) == parent:
            found["parent's child"] += 1
        else:
            found["other"] += 1
    return statuses, found, int(completions or 0), int(cut or 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dbs", type=Path, nargs="+")
    args = ap.parse_args()
    statuses: Counter[str] = Counter()
    found: Counter[str] = Counter()
    completions = cut = 0
    for db in args.dbs:
        s, f, n, c = causes(db)
        statuses, found, completions, cut = statuses + s, found + f, completions + n, cut + c
        print(f"{db}: variants {dict(s)}; duplicates by cause {dict(f)}; {c} of {n} completions cut at the budget")
    total, duplicates = sum(statuses.values()), statuses["duplicate"]
    print("cause of duplicates | count | share")
    for cause in CAUSES:
        print(f"{cause:19} | {found[cause]:5} | {found[cause] / max(duplicates, 1):.0%}")
    shares = " ".join(f"{cause.replace(' ', '_').replace(chr(39), '')}={found[cause]}" for cause in CAUSES)
    print(f"copies variants={total} duplicates={duplicates} {shares} cut={cut}/{completions}")


if __name__ == "__main__":
    main()
