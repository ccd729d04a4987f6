"""Metrics named in config.yaml's feature_dimensions."""

import importlib.util


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exact = sum(module.solve(x) == x * x for x in range(10)) / 10
    with open(program_path) as f:
        size = len(f.read())
    return {"combined_score": exact, "accuracy": exact, "brevity": 100.0 / size}
