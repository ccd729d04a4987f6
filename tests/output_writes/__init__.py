"""The files `evolve best --out`, `evolve export`, `evolve report --out/--html` and `evolve init --from` write for
the user (issue #57, red-team findings 1, 2 and 11, and their follow-ups).

Every archive here is made by running the engine (`evolve run` with a replayed model) on small shell problems,
whose candidates run whatever text they are given: a model's variant that reads as a tree of files
(`=== FILE: .git/config ===`) is a valid one-file program there, and scores. The commands must write a one-file
program as its problem's seed file whatever its text, a program of several files only at the paths its
problem's `[program] files` allow (never a dot part), never through a symlink, and never over a file they did
not write; each refusal is one line and exit code 2, and the file planted outside keeps its exact bytes.

Split by what they check: test_program_layout.py (what is written where), test_no_link_no_overwrite.py (never
through a link, never over a file of the user's, never into a folder another user owns),
test_report_and_init_writes.py (`evolve report --out/--html`, `evolve init --from`). The runs they read are
conftest.py's, made once for the package; the problems and the commands are shell_runs.py's.
"""
