"""Programs and their evaluations: stored in batches through `batch.py`, read back by id, run and lineage."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select, update

from evolve.archive.batch import NewProgram, add_evaluated_programs
from evolve.archive.codehash import HASH_VERSION, code_hash
from evolve.archive.database import Database
from evolve.archive.lineage import LineageNode, ancestry, chain
from evolve.archive.models import Evaluation, Program
from evolve.archive.records import ProgramRecord, RunRecord, StoredEvaluation, StoredProgram
from evolve.archive.trees import fill_code, resolve_codes


@dataclass(frozen=True)
class HashUpgrade:
    """What `upgrade_code_hashes` did to a run stored under an earlier normalisation."""

    upgraded: int  # programs whose hash is now of the current normalisation
    kept: int  # programs the current normalisation finds equal to an older one of the run: they keep the old hash


@dataclass(frozen=True)
class ScoredProgram:
    """The slim row the selection indexes are built from (no code, no blobs)."""

    id: int
    island: int
    generation: int
    parent_id: int | None
    scores: dict[str, float]
    scalar: float | None
    error_kind: str | None
    code_length: int


class ProgramStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add_evaluated(self, run_id: int, items: Sequence[NewProgram], multi_file: bool = False) -> list[StoredProgram]:
        """Store programs with their evaluations, all or none; what became of each item (see `batch.py`).
        `multi_file`: the run's problem is one of several files (`Problem.multi_file`), which decides how each
        program is hashed and stored; never its text (trees.py)."""
        return add_evaluated_programs(self.db.engine, run_id, items, multi_file)

    def find(self, run_id: int, code: str, multi_file: bool = False) -> int | None:
        """The id of the run's program with this normalised code, if any (`multi_file`: as `add_evaluated`)."""
        digest = code_hash(code, multi_file)
        with self.db.session() as s:
            return s.scalar(select(Program.id).where(Program.run_id == run_id, Program.code_hash == digest))

    def get(self, program_id: int) -> ProgramRecord | None:
        """One program with its full text and its evaluation (None when it has none yet)."""
        with self.db.session() as s:
            prog = s.get(Program, program_id)
            if prog is None:
                return None
            fill_code(s, [prog])
            ev = prog.evaluation
            return ProgramRecord.of(prog, None if ev is None else StoredEvaluation.of(ev))

    def scored(self, run_id: int) -> list[ScoredProgram]:
        q = (
            select(
                Program.id,
                Program.island,
                Program.generation,
                Program.parent_id,
                Evaluation.scores,
                Evaluation.scalar,
                Evaluation.error_kind,
                func.coalesce(Program.tree_length, func.length(Program.code)),
            )
            .join(Evaluation, Evaluation.program_id == Program.id)
            .where(Program.run_id == run_id)
            .order_by(Program.id)
        )
        with self.db.session() as s:
            return [ScoredProgram(*row) for row in s.execute(q)]

    def codes(self, program_ids: Sequence[int]) -> dict[int, str]:
        with self.db.session() as s:
            rows = s.execute(
                select(Program.id, Program.code, Program.tree_length).where(Program.id.in_(list(program_ids)))
            )
            return resolve_codes(s, rows.all())

    def count(self, run_id: int) -> int:
        with self.db.session() as s:
            return s.scalar(select(func.count(Program.id)).where(Program.run_id == run_id)) or 0

    def code_hashes(self, run_id: int) -> dict[str, int]:
        """normalised-code hash → program id for a run: the duplicate index the loop keeps in memory."""
        with self.db.session() as s:
            rows = s.execute(select(Program.code_hash, Program.id).where(Program.run_id == run_id))
            return dict(rows.all())

    def upgrade_code_hashes(self, run_id: int, multi_file: bool = False) -> HashUpgrade:
        """Rehash, with the current normalisation, the run's programs stored under an earlier one, in one
        transaction; a no-op (one indexed query) when all are current. `multi_file`: as `add_evaluated`.

        A resumed run must hash its archive as it hashes new variants, or a variant equal to a stored program
        would be stored again. Where two stored programs become one under the current normalisation (they differ
        only in local names), the older takes the hash and the later keeps its old one: both stay, the unique
        index holds, and a new variant equal to either is a duplicate of the older.
        """
        current = Program.code_hash.startswith(HASH_VERSION, autoescape=True)
        with self.db.session() as s:
            stale_rows = s.execute(
                select(Program.id, Program.code, Program.tree_length)
                .where(Program.run_id == run_id, ~current)
                .order_by(Program.id)
            ).all()
            stale = list(resolve_codes(s, stale_rows).items())
            if not stale:
                return HashUpgrade(0, 0)
            taken = set(s.scalars(select(Program.code_hash).where(Program.run_id == run_id, current)))
            upgraded = 0
            for program_id, code in stale:
                digest = code_hash(code, multi_file)
                if digest in taken:
                    continue
                taken.add(digest)
                s.execute(update(Program).where(Program.id == program_id).values(code_hash=digest))
                upgraded += 1
        return HashUpgrade(upgraded, len(stale) - upgraded)

    def evaluation_rows(self, run: RunRecord) -> list[tuple[ProgramRecord, StoredEvaluation]]:
        """Every evaluated program of the run with its evaluation, by program id (one query, codes joined)."""
        with self.db.session() as s:
            rows = s.execute(
                select(Program, Evaluation).join(Evaluation).where(Program.run_id == run.id).order_by(Program.id)
            ).all()
            fill_code(s, [program for program, _ in rows])
            pairs = []
            for program, ev in rows:
                stored = StoredEvaluation.of(ev)
                pairs.append((ProgramRecord.of(program, stored), stored))
            return pairs

    def best_by_scalar(self, run: RunRecord) -> ProgramRecord | None:
        """The successful program with the highest scalar view (the oldest among equals), with its evaluation."""
        q = (
            select(Program, Evaluation)
            .join(Evaluation)
            .where(Program.run_id == run.id, Evaluation.error_kind.is_(None))
            .order_by(Evaluation.scalar.desc(), Program.id)
            .limit(1)
        )
        with self.db.session() as s:
            best = s.execute(q).first()
            if best is None:
                return None
            fill_code(s, [best[0]])
            return ProgramRecord.of(best[0], StoredEvaluation.of(best[1]))

    def ancestry(self, program_ids: Iterable[int | None], steps: int = 200) -> list[LineageNode]:
        """The union of the programs' ancestor chains, each at most `steps` parents up (see `lineage.py`)."""
        with self.db.session() as s:
            return ancestry(s, program_ids, steps)

    def lineage(self, program_id: int, limit: int = 50) -> list[LineageNode]:
        """The program, its parent, and so on: `limit` programs at most."""
        if limit < 1:
            return []
        return chain(self.ancestry([program_id], limit - 1), program_id)[:limit]
