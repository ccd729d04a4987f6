"""Read a run and aggregate it into `Views`: the one entry point the report and the server share."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import numpy as np

from evolve.archive import Archive, RunRecord, summary_yield
from evolve.fitness import signs
from evolve.report import queries
from evolve.report.aggregate import (
    Views,
    buckets,
    count_by,
    grid_views,
    pareto_view,
    run_components,
    running_best,
    seconds_since,
    throughput_view,
    version_view,
)
from evolve.report.token_spans import token_spans
from evolve.yields import worst_values

MAX_LINEAGE_ROOTS = 6


def build_views(archive: Archive, run: RunRecord) -> Views:
    specs = run_components(run)
    names = [c.name for c in specs]
    cols = queries.evaluation_columns(archive, run.id, names)
    start = run.created_at
    ids, islands, scalar, matrix = cols.program_id, cols.island, cols.scalar, cols.scores
    t = seconds_since(start, cols.evaluated_at)
    everyone = np.ones(len(ids), dtype=bool)

    progress = {"all": running_best(scalar, everyone, ids, t)}
    for island in sorted(set(islands.tolist())):
        progress[f"island {island}"] = running_best(scalar, islands == island, ids, t)
    components = {c.name: running_best(matrix[:, d], everyone, ids, t, c.sign) for d, c in enumerate(specs)}
    island_components = {
        f"island {island}": {
            c.name: running_best(matrix[:, d], islands == island, ids, t, c.sign) for d, c in enumerate(specs)
        }
        for island in sorted(set(islands.tolist()))
    }

    statuses, var_at = queries.variant_rows(archive, run.id)
    spans = token_spans(archive, run.id)
    tokens = spans.tokens
    var_t, tok_t = seconds_since(start, var_at), seconds_since(start, spans.end)
    t_end = float(np.nanmax(np.concatenate([[0.0], t, var_t])))
    edges = buckets(t_end)
    kinds = [kind or "ok" for kind in cols.error_kind]

    roots: list[int] = []
    for steps in [progress["all"], *components.values()]:
        if steps.ids and steps.ids[-1] not in roots:
            roots.append(steps.ids[-1])
    error_counts = Counter(k for k in kinds if k != "ok")
    meta = {
        "run_id": run.id,
        "problem": run.problem_name,
        "status": run.status,
        "evaluations": len(ids),
        "errors": dict(error_counts),
        "components": names,
        "islands": len(progress) - 1,
        "best_scalar": progress["all"].y[-1] if progress["all"].y else None,
        "best_id": progress["all"].ids[-1] if progress["all"].ids else None,
        "variants": dict(Counter(statuses)),
        "completions": len(tokens),
        "elapsed_s": run.state.elapsed_s or t_end,
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        # what the children brought, as `evolve inspect` counts it (evolve.yields): the run's headline figure
        "quality": summary_yield(archive.summarize(run, signs(specs), worst_values(specs))).quality_line(),
    }
    return Views(
        meta=meta,
        progress=progress,
        components=components,
        island_components=island_components,
        pareto=pareto_view(ids, scalar, matrix, specs),
        grids=grid_views(ids, islands, scalar, matrix, cols.code_length, run, specs),
        errors={"t": edges.tolist(), "counts": count_by(kinds, t, edges)},
        parse={"t": edges.tolist(), "counts": count_by(statuses, var_t, edges)},
        throughput=throughput_view(
            edges,
            t,
            (seconds_since(start, spans.start), tok_t),
            tokens,
            seconds_since(start, queries.valid_child_times(archive, run.id)),
        ),
        versions=version_view(queries.version_rows(archive, run.id), start),
        lineage_roots=roots[:MAX_LINEAGE_ROOTS],
    )
