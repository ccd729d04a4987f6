"""Read a run and aggregate it into `Views`: the one entry point the report and the server share."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import numpy as np

from evolve.archive.models import Run
from evolve.archive.store import Archive
from evolve.report import queries
from evolve.report.aggregate import (
    Views,
    buckets,
    count_by,
    grid_views,
    pareto_view,
    run_components,
    running_best,
    score_matrix,
    seconds_since,
    throughput_view,
    version_view,
)

MAX_LINEAGE_ROOTS = 6


def build_views(archive: Archive, run: Run) -> Views:
    specs = run_components(run)
    names = [c.name for c in specs]
    rows = queries.evaluation_rows(archive, run.id)
    start = run.created_at
    ids = np.array([r.program_id for r in rows], dtype=np.int64)
    islands = np.array([r.island for r in rows], dtype=np.int64)
    scalar = np.array([np.nan if r.error_kind or r.scalar is None else r.scalar for r in rows], dtype=float)
    t = seconds_since(start, [r.evaluated_at for r in rows])
    matrix = score_matrix(rows, names)
    everyone = np.ones(len(rows), dtype=bool)

    progress = {"all": running_best(scalar, everyone, ids, t)}
    for island in sorted(set(islands.tolist())):
        progress[f"island {island}"] = running_best(scalar, islands == island, ids, t)
    components = {c.name: running_best(matrix[:, d], everyone, ids, t, c.sign) for d, c in enumerate(specs)}

    variants = queries.variant_rows(archive, run.id)
    completions = queries.completion_rows(archive, run.id)
    valid = queries.valid_child_times(archive, run.id)
    var_t = seconds_since(start, [at for _, at in variants])
    tok_t = seconds_since(start, [at for at, _ in completions])
    t_end = max([0.0, *t[-1:].tolist(), *(var_t.max(initial=0.0),)])
    edges = buckets(t_end)
    kinds = [r.error_kind or "ok" for r in rows]

    roots: list[int] = []
    for steps in [progress["all"], *components.values()]:
        if steps.ids and steps.ids[-1] not in roots:
            roots.append(steps.ids[-1])
    error_counts = Counter(k for k in kinds if k != "ok")
    meta = {
        "run_id": run.id,
        "problem": run.problem_name,
        "status": run.status,
        "evaluations": len(rows),
        "errors": dict(error_counts),
        "components": names,
        "islands": len(progress) - 1,
        "best_scalar": progress["all"].y[-1] if progress["all"].y else None,
        "best_id": progress["all"].ids[-1] if progress["all"].ids else None,
        "variants": dict(Counter(status for status, _ in variants)),
        "completions": len(completions),
        "elapsed_s": float(run.state.get("elapsed_s", t_end)),
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    return Views(
        meta=meta,
        progress=progress,
        components=components,
        pareto=pareto_view(ids, scalar, matrix, specs),
        grids=grid_views(rows, run, specs),
        errors={"t": edges.tolist(), "counts": count_by(kinds, t, edges)},
        parse={"t": edges.tolist(), "counts": count_by([s for s, _ in variants], var_t, edges)},
        throughput=throughput_view(
            edges,
            t,
            tok_t,
            np.array([n for _, n in completions], dtype=float),
            seconds_since(start, valid),
        ),
        versions=version_view(queries.version_rows(archive, run.id), start),
        lineage_roots=roots[:MAX_LINEAGE_ROOTS],
    )
