"""A stand-in for `openevolve.evaluation_result`, so OpenEvolve evaluators import it inside our sandboxes.

Written for this project (stdlib only). The harness installs this source as the module
`openevolve.evaluation_result` before it imports a simple-form evaluator, in the process and the Docker
sandbox alike; nothing of the real `openevolve` package is needed or used. The harness reads `metrics` as
scores and `artifacts` as feedback for the prompt.
"""

from dataclasses import dataclass, field

EVALUATION_FAILED_METRIC = "__evaluation_failed__"


@dataclass
class EvaluationResult:
    """Named metrics (the scores) plus artifacts (text the model should read: errors, logs, hints)."""

    metrics: dict = field(default_factory=dict)
    artifacts: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, metrics):
        return cls(metrics=dict(metrics))

    def to_dict(self):
        return self.metrics

    def has_artifacts(self):
        return bool(self.artifacts)

    def get_artifact_keys(self):
        return list(self.artifacts)

    def get_artifact_size(self, key):
        value = self.artifacts.get(key)
        if value is None:
            return 0
        if isinstance(value, bytes):
            return len(value)
        return len(str(value).encode("utf-8"))

    def get_total_artifact_size(self):
        return sum(self.get_artifact_size(key) for key in self.artifacts)
