"""The answer's shape as a GBNF grammar (llama.cpp's grammar format): what a completion may look like.

Why: a small model spends many of its tokens on prose headings, tags a variant and writes no code, or writes
fewer variants than asked; the parser then drops them. The prompt (evolve/prompts/builder.py) asks for m
variants, each `<variant k>` ... `</variant k>`, each holding fenced code in the problem's language (the `full`
edit format) or SEARCH/REPLACE edits (`diff`). Sampling under this grammar makes every completion that ends
hold exactly that: the opening tag, then the code at once, then the closing tag. No line of prose may come before
the code: given one, the embedded model wrote its function's first line there (`def solve(text):`) and began the
fence with the body, so half of a problem's variants failed with `unexpected indent` (24 of 48 on `durations`).
Under `diff` a variant may also be fenced code, as the parser accepts: the embedded model, held to edits only,
wrote edits without their `=======` (3 of 12 variants applied, against 12 of 12 sampled freely, mostly as
fenced rewrites; benchmarks/structured_speed.py). The code itself is free text; only a line that would end its
fence or edit, or a variant, or start an edit, from inside it is held to the form (`CODE_LINE_NEVER`,
`EDIT_MARKERS`), indented or not (the parser finds a fence or a marker wherever it stands).

A lead comment (`AnswerShape.lead_comment`, issue 37, "fewer copies"): under the grammar the embedded model wrote
the parent back verbatim in most `full` variants (86% of circle_packing's were duplicates, 89% of spread_points'
unchanged). So where it is asked, each fenced block opens with a comment in the fence language's own line-comment
form, `# Change: <what this variant changes>` (`//` in C and its kin: `LINE_COMMENTS`), then at most one more
comment line at column 0, then a line of code (one that is not blank and starts, after its indentation, with
neither the comment's first character nor what no code line starts with), then code as ever. Unlike a line of
prose before the fence, the comment is inside it and is a line of the program's own language: the code's first
line stays where the fence puts it, so nothing is indented wrongly; the model has to name a change before it
writes code. Measured on 2 problems x 2 seeds x 4 completions x 3 variants (48 variants), the embedded model on
llama.cpp: without it 2 new, 43 copies, 3 unparseable in 4,021 tokens; with the lead line, any number of comment
lines and then code, 9 new, 31 copies, 8 unparseable in 5,567 tokens, but on circle_packing the model wrote
`# Change: ...` lines until its token budget ran out (hence at most one more comment line); with the lead line alone
it often wrote comment-only variants (hence the line of code). This form (one more comment line at most) is not
measured itself, and the full A/B over all problems (benchmarks/yield.py, `--lead-comment on` and `off`) is still
to be run. The parser drops the lead line (evolve/prompts/parser.py), so a copy under a new lead is `unchanged` in
any language; a copy with one more comment line is a duplicate in Python (its hash drops comments), but looks new
in another language (hashed as written), and a C block that opens with a `/* ... */` line cannot be copied verbatim
(that line starts with `/`). The two comment lines hold no backtick, `<` or backslash (`COMMENT_NEVER`): a
reviewer's lead `# Change: unlike <variant 2>, ...` cost both variants.

The grammar is a pure function of the answer's shape (m, edit format, fence language, lead comment): the same
string for every group of a run, so a backend can parse it once and copy its state per row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EDIT_FORMATS = ("full", "diff")
# What no line of code may begin with, after its indentation: a fence, and a variant's tag, closing or opening
# (no language's code line starts so; a small model that means to end its variant there is led to close its fence
# or edit first)...
CODE_LINE_NEVER = ("```", "</", "<variant")
# ...nor an edit's marker as the parser reads one (5 or more of the character, wherever it stands: a fenced block
# holding one is read as edits): a SEARCH that never met its `=======` ran on over the next variants
EDIT_MARKERS = ("<<<<<", "=====", ">>>>>")
NL, INDENT = "\n", " \t"
# The line comment of each fence language the lead comment is asked in (none for a bare fence or another tag).
LINE_COMMENTS = {"python": "#"} | dict.fromkeys(
    ("c", "cpp", "c++", "rust", "go", "java", "javascript", "js", "typescript", "ts", "csharp", "cs", "swift",
     "kotlin", "scala"),
    "//",
)  # fmt: skip
LEAD_WORD = "Change: "  # after the comment's prefix and a space: `# Change: <what this variant changes>`
# What the lead comment's text and the comment line after it may not hold anywhere: a backtick and a `<` (the parser
# reads a fence or a tag in the middle of a line: a lead that says `unlike <variant 2>` lost both variants), and a
# backslash (a `//` comment that ends with one goes on over the next line in C, which the parser would then make
# code by dropping the lead).
COMMENT_NEVER = "`<\\"


_PATH = re.compile(r"[^\s=`*<>]+")  # a path a header may name: what evolve/prompts/tree_edits.py reads as one


def file_header(path: str) -> str:
    """The line that names a file of a program of several files, as the prompt shows it (without its newline)."""
    return f"=== FILE: {path} ==="


def lead_text(prefix: str) -> str:
    """What a lead comment line begins with, before its own text: `# Change: `."""
    return f"{prefix} {LEAD_WORD}"


@dataclass(frozen=True)
class AnswerShape:
    """What the prompt asked for: `variants` answers, each in `edit_format` ("full": fenced code blocks;
    "diff": SEARCH/REPLACE edits), its fences tagged `language` ("" for a bare fence), each fenced block of a
    `full` answer opened by a `lead_comment` line (its comment prefix, `#` or `//`; "": none). For a program of
    several files, `files` are the paths of those it may change (the files with EVOLVE blocks): each variant is
    then one or more sections, each a file's header line (`file_header`) and that file's blocks or edits."""

    variants: int
    edit_format: str
    language: str = ""
    lead_comment: str = ""
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.variants < 1:
            raise ValueError(f"an answer holds at least one variant, not {self.variants}")
        if self.edit_format not in EDIT_FORMATS:
            raise ValueError(f"edit format {self.edit_format!r} has no grammar; use one of {EDIT_FORMATS}")
        if not all(c.isalnum() or c in "+#.-_" for c in self.language):
            raise ValueError(f"fence language {self.language!r} is not a fence tag")
        if self.lead_comment and (self.edit_format != "full" or self.lead_comment not in LINE_COMMENTS.values()):
            raise ValueError(f"no lead comment {self.lead_comment!r} under {self.edit_format}: `full` takes # or //")
        for path in self.files:
            if not _PATH.fullmatch(path):
                raise ValueError(f"file {path!r} cannot be named in a header: a path without spaces, =, `, * or <>")


def _literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _char_not(chars: str) -> str:
    """A GBNF class of any one character but a newline and `chars`."""
    return "[^\\n" + "".join("\\t" if c == "\t" else "\\" + c if c in "]^-\\" else c for c in chars) + "]"


def line_not_starting_with(*prefixes: str, indent: bool = False, blank: bool = True) -> str:
    """A GBNF expression for one line (its newline included) that begins with none of `prefixes` (with `indent`:
    none of them after its leading spaces and tabs either; without `blank`, a line that holds something else).

    Written without ambiguity, so that llama.cpp's grammar engine keeps one stack per row: the line ends, or
    goes on with a character no prefix goes on with (then anything), or with one that some prefixes share, the
    rest of the line then held to their remainders; a prefix used up is a line ruled out. The indentation is
    one run of spaces and tabs, after which only a character that is neither may come."""
    firsts = sorted({p[0] for p in prefixes})
    other = _char_not("".join(firsts) + (INDENT if indent else ""))
    options = ['"\\n"'] if blank else []
    options.append(f'{other} [^\\n]* "\\n"')
    for c in firsts:
        rests = [p[1:] for p in prefixes if p[0] == c]
        if "" not in rests:
            options.append(f"{_literal(c)} {line_not_starting_with(*rests)}")
    return ("[ \\t]* " if indent else "") + "( " + " | ".join(options) + " )"


def answer_gbnf(shape: AnswerShape) -> str:
    """The GBNF grammar (root rule `root`) of a completion of `shape`.

    `full`: after the opening tag's line, one or more fenced blocks ("```language" ... "```"), then the closing
    tag. `diff`: after the opening tag's line, one or more SEARCH/REPLACE edits, or one or more fenced blocks.
    Variants follow each other separated by one newline or two; the grammar ends after `</variant m>` (a
    completion's stop string), where only an end-of-turn token may follow. A fence's close and an edit's divider
    and close may be indented (the parser reads them so). With a lead comment, a `full` block opens with it (the
    module's docstring). With `files`, each variant is one or more sections: a file's header line, then that
    file's blocks (or edits) as above. Each choice is settled by a line's first characters, as
    `line_not_starting_with`'s (a header starts with `=`, which neither a fence nor an edit nor a tag does)."""
    blocks = "fenced+" if shape.edit_format == "full" else "( edit+ | fenced+ )"  # a variant's, or one file's
    body = "section+" if shape.files else blocks
    numbers = range(1, shape.variants + 1)
    rules = ["root ::= " + ' "\\n" "\\n"? '.join(f"variant{k}" for k in numbers)]
    rules += [f"variant{k} ::= {_literal(f'<variant {k}>' + NL)} {body} {_literal(f'</variant {k}>')}" for k in numbers]
    lead = " lead" if shape.lead_comment else ""
    rules.append(f'fenced ::= {_literal(f"```{shape.language}" + NL)}{lead} code-line* [ \\t]* "```\\n"')
    rules.append(f"code-line ::= {line_not_starting_with(*CODE_LINE_NEVER, *EDIT_MARKERS, indent=True)}")
    if shape.lead_comment:
        prefix = shape.lead_comment
        first = line_not_starting_with(*CODE_LINE_NEVER, *EDIT_MARKERS, prefix[0], indent=True, blank=False)
        text = _char_not(COMMENT_NEVER)
        comment = f'( {_literal(prefix)} {text}* "\\n" )?'
        rules.append(f'lead ::= {_literal(lead_text(prefix))} {text}+ "\\n" {comment} first-code')
        rules.append(f"first-code ::= {first}")
    if shape.files:
        rules.append(f"section ::= header {blocks}")
        rules.append("header ::= " + " | ".join(_literal(file_header(path) + NL) for path in shape.files))
    if shape.edit_format == "diff":
        divider, closer = '[ \\t]* "=======\\n"', '[ \\t]* ">>>>>>> REPLACE\\n"'
        rules.append(f'edit ::= "<<<<<<< SEARCH\\n" code-line* {divider} code-line* {closer}')
    return "\n".join(rules) + "\n"
