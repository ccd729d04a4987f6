"""The closed loop's paired differences: an arm is compared with another only on the (problem, seed) pairs where
both finished, so a half-done grid never pairs one problem's trained arm with another problem's untrained one."""

from __future__ import annotations

from benchmarks.closed_loop_arm import ArmResult
from benchmarks.closed_loop_report import bootstrap, contrast, paired


def arm(problem: str, seed: int, name: str, best: float, copies: float = 0.5) -> ArmResult:
    return ArmResult(
        problem=problem,
        arm=name,
        seed=seed,
        seed_scalar=1.0,
        best_scalar=best,
        best_ratio=best,
        curve=[best],
        valid_per_group=[1],
        new_valid=1,
        tokens=100,
        valid_per_1k_tokens=10.0,
        copy_share=copies,
        diversity=0.0,
        groups=1,
        updates=0,
        update_failures=0,
    )


def test_differences_pair_arms_of_the_same_problem_and_seed_only() -> None:
    results = [
        arm("a", 0, "none", 1.0, copies=0.7),
        arm("a", 0, "vpo", 1.3, copies=0.2),
        arm("b", 0, "none", 2.0),
        arm("a", 1, "vpo", 9.0),  # no untrained arm on (a, 1): left out, not paired with (b, 0)
        arm("b", 1, "none", 1.0),
        arm("b", 1, "vpo", 1.1),
    ]
    assert [round(d, 6) for d in paired(results, "best_ratio", "vpo", "none")] == [0.3, 0.1]
    assert [round(d, 6) for d in paired(results, "copy_share", "vpo", "none")] == [-0.5, 0.0]
    assert paired(results, "best_ratio", "vpo", "grpo") == []
    assert contrast(results, "best_ratio", "vpo", "grpo") == ""
    assert contrast(results, "best_ratio", "vpo", "none").startswith("vpo-none=+0.200 [+0.100, +0.300] (n=2)")


def test_bootstrap_interval_holds_the_mean_and_is_a_point_for_one_pair() -> None:
    mean, lo, hi = bootstrap([0.1, 0.2, 0.6, -0.1])
    assert lo <= mean <= hi and round(mean, 6) == 0.2
    assert bootstrap([0.25]) == (0.25, 0.25, 0.25)


def test_a_finished_arm_keeps_its_last_adapter_version_only(tmp_path) -> None:
    """The trained policy (the last version; v10 sorts after v9 by number, not by name) survives the arm, for
    best@k after it; earlier versions are dropped (~25 MB each)."""
    from benchmarks.closed_loop import keep_last_adapter

    for name in ("v1", "v2", "v9", "v10"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_model.safetensors").write_bytes(b"x")
    keep_last_adapter(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v10"]
    keep_last_adapter(tmp_path / "missing")  # an untrained arm has no adapters folder
