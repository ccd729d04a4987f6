"""Different keys on failure: {"combined_score": 0.0, "error": "..."}, as many OpenEvolve examples do."""

import importlib.util
import traceback


def evaluate(program_path):
    try:
        spec = importlib.util.spec_from_file_location("candidate", program_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        outputs = [module.solve(x) for x in range(6)]
    except Exception as exc:
        return {"combined_score": 0.0, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=1)}
    exact = sum(o == x * x for x, o in enumerate(outputs)) / 6
    error = sum(abs(o - x * x) for x, o in enumerate(outputs))
    return {"combined_score": exact, "exact": exact, "closeness": 1.0 / (1.0 + error), "outputs": outputs}
