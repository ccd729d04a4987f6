"""`others_view = "diff"`: the prompt shows the other programs and the parent's recent children by their changes
from the parent, never as a whole program a small model could paste back; a program whose blocks cannot be
paired with the parent's, or one too long to diff quickly, is shown whole as before."""

from __future__ import annotations

from evolve.prompts import PromptInputs, ShownProgram, build_prompt

PARENT = """import math
# EVOLVE-BLOCK-START
def score(x):
    a = 1
    b = 2
    c = 3
    return x + a
# EVOLVE-BLOCK-END
"""
OTHER = PARENT.replace("return x + a", "return x * a + b")
RECENT = PARENT.replace("b = 2", "b = 5")


def prompt(view: str, others: list[str], recent: list[str] = (), parent: str = PARENT) -> str:
    inputs = PromptInputs(
        "Score well.", parent, {"s": 1.0}, None, [ShownProgram(o, {"s": 2.0}) for o in others], 2, "full",
        recent=list(recent), others_view=view,
    )  # fmt: skip
    return build_prompt(inputs)


def shown_after(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n# ", 1)[0]


def test_diff_view_shows_each_other_program_and_recent_child_by_its_changes_only():
    text = prompt("diff", [OTHER, PARENT], [RECENT])
    first = shown_after(text, "# Other program 1 (its changes from the current program)")
    assert "```diff\n@@ -3,3 +3,3 @@\n     b = 2\n     c = 3\n-    return x + a\n+    return x * a + b\n```" in first
    assert "def score(x):" not in first  # nothing to paste: the unchanged head is not shown
    same = shown_after(text, "# Other program 2 (its changes from the current program)")
    assert "(the same editable code as the current program)" in same
    recent = shown_after(text, "# Recent children of the current program")
    assert "```diff\n@@ -1,5 +1,5 @@\n def score(x):\n     a = 1\n-    b = 2\n+    b = 5\n" in recent
    assert text.count("```python\n") == 1  # the parent's code, and only it, is shown whole


def test_code_view_is_unchanged_and_programs_that_cannot_be_paired_are_shown_whole():
    assert "```diff" not in prompt("code", [OTHER], [RECENT])
    assert shown_after(prompt("code", [OTHER]), "# Other program 1").count("def score(x):") == 1
    broken = OTHER.replace("# EVOLVE-BLOCK-END\n", "")  # its markers broke: no block to pair with the parent's
    text = prompt("diff", [broken])
    assert "# Other program 1\n" in text and "```diff" not in text and "return x * a + b" in text
    two_blocks = OTHER + "# EVOLVE-BLOCK-START\nK = 1\n# EVOLVE-BLOCK-END\n"
    assert "```diff" not in prompt("diff", [two_blocks])


def test_a_program_too_long_for_a_quick_diff_is_shown_whole():
    body = "".join(f"    v{i} = {i}\n" for i in range(5000))
    parent = f"# EVOLVE-BLOCK-START\ndef score(x):\n{body}    return x\n# EVOLVE-BLOCK-END\n"
    child = parent.replace("v1 = 1", "v1 = 2").replace("v4000 = 4000", "v4000 = 0")
    text = prompt("diff", [child], parent=parent)
    assert "```diff" not in shown_after(text, "# Other program 1")
