"""A compiled program of several files in both sandboxes: its build writes object files into the program's own
subfolder, and a candidate can neither delete nor replace a job file there, nor move the subfolder away (the
Docker runner gives each subfolder /work's mode, root's with the sticky bit; the process sandbox's jail makes each
a tmpfs of its own, a mount point, and binds each job file into it read-only)."""

from __future__ import annotations

import pytest

from evolve.problem import load_problem
from tests.native import KNOWN_TREE, assert_known_tree_vectors, tree_program, write_c_tree_problem
from tests.test_native_hostile import sandbox  # noqa: F401 - the process and Docker sandboxes, as there

# Run by the build (`./prog --build`) and again before each case: replace the fixed lib/offset.h with one that
# adds 1, delete the program's own lib/solve.c, make offset.h writable, and move the whole folder `lib` away to
# put a `lib/offset.h` of its own in its place. `changed` says whether any of it worked (at run time: whether
# lib/offset.h still holds what the engine wrote), and solve() answers wrongly if so: the candidate's score is
# the record of what it could do.
ATTACK = """#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
static int changed;
__attribute__((constructor)) static void attack(void) {
    FILE *f = fopen("lib/evil.h", "w");
    if (f) { fputs("#define OFFSET 1\\n", f); fclose(f); }
    if (rename("lib/evil.h", "lib/offset.h") == 0) changed = 1;
    if (unlink("lib/solve.c") == 0) changed = 1;
    if (chmod("lib/offset.h", 0666) == 0) changed = 1;
    if (rename("lib", "moved") == 0 && mkdir("lib", 0777) == 0 && (f = fopen("lib/offset.h", "w"))) {
        fputs("#define OFFSET 1\\n", f);
        fclose(f);
    }
    char text[64] = "";
    if (!(f = fopen("lib/offset.h", "r")) || !fgets(text, sizeof text, f) || strcmp(text, "#define OFFSET 0\\n"))
        changed = 1;
    if (f) fclose(f);
}"""
# Every attempt fails in both sandboxes: in Docker the job's files are root's in sticky folders (EPERM), in the
# process sandbox's jail each job file and each folder holding them is a mount point (EBUSY, EROFS; without root
# the folder is the candidate's own, and moving it worked while it was not). So the attacker scores as the
# honest square.
HONEST = KNOWN_TREE[0][1]


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_c_tree_problem(tmp_path_factory.mktemp("tree")))


def test_a_build_writes_its_object_files_into_the_programs_subfolder(sandbox, problem):  # noqa: F811
    assert problem.files == ("main.c", "lib/offset.h", "lib/solve.c")
    seed = sandbox.evaluate(problem, problem.seed_code)
    assert seed.ok and seed.scores == KNOWN_TREE[0][1], seed.error
    assert seed.build_s is not None and 0 < seed.build_s < seed.duration_s  # each sandbox reports the build's time
    assert sandbox.evaluate(problem, KNOWN_TREE[1][0]).scores == KNOWN_TREE[1][1]


def test_a_candidate_cannot_change_a_job_file_in_a_subfolder_for_itself_or_the_next(sandbox, problem):  # noqa: F811
    attacker = sandbox.evaluate(problem, tree_program("changed ? -1 : x * x", head=ATTACK))
    assert attacker.error_kind is None, attacker.error
    assert attacker.scores == HONEST
    assert_known_tree_vectors(sandbox, problem)
