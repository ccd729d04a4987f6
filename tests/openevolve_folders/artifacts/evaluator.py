"""EvaluationResult with artifacts; the program is imported by module name from its folder."""

import os
import sys

from openevolve.evaluation_result import EvaluationResult


def evaluate(program_path):
    sys.path.insert(0, os.path.dirname(program_path))
    module = __import__(os.path.splitext(os.path.basename(program_path))[0])
    wrong = [x for x in range(8) if module.solve(x) != x * x]
    score = 1.0 - len(wrong) / 8
    return EvaluationResult(
        metrics={"combined_score": score, "correct": 8.0 - len(wrong)},
        artifacts={"wrong_inputs": f"solve(x) != x*x for x in {wrong}" if wrong else "all inputs right"},
    )
