"""A policy that replays recorded completions: for benchmarks of the engine without model cost."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from policies.policy import Generated, PolicyError, SamplingParams


class ReplayPolicy:
    max_concurrency = 4

    def __init__(self, texts: list[str], name: str = "replay") -> None:
        if not texts:
            raise PolicyError("replay policy has no completions to replay")
        self.name, self.version = name, 0
        self._texts = itertools.cycle(texts)

    @classmethod
    def from_file(cls, path: str) -> ReplayPolicy:
        """A JSON list of completion texts, or JSON lines each with a `text` field."""
        file = Path(path)
        if not file.is_file():
            raise PolicyError(f"{path}: no such replay file; give a JSON list of completion texts")
        raw = file.read_text()
        try:
            data = json.loads(raw)
        except ValueError:
            data = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
        return cls([str(t) for t in data], name=f"replay:{file.name}")

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        return [Generated(next(self._texts), None, None, "stop", self.version) for _ in range(n)]

    def close(self) -> None:
        pass
