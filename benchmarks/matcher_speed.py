"""What holding a transformers row to the answer's shape costs per token: the pure-Python matcher
(`policies.answer_matcher`, through `policies.held_rows`) judging candidate tokens of the embedded model's
vocabulary (151,936 ids), on answers written from the problems' own programs, tokenised as the model would.

Per answer (m=3 variants of a problem's program, fenced for `full`, one SEARCH/REPLACE edit each for `diff`),
each of its tokens is judged among k candidates (the token and k-1 others of the vocabulary at random: the
nucleus under top-p is a few to tens of tokens), then accepted: the time per token is what a row adds to a
decoding step. Whole-vocabulary masks (needed only when no token of the nucleus is allowed) are timed cold, once
per distinct state met along one answer per format, and remembered after (`HeldVocab.full_mask`).

Needs only the embedded tokenizer (`--model DIR`: another model's, as the smoke run's tiny one), no model.
Last line: `matcher_speed decode_s=... us_per_token_k2=...
us_per_token_k32=... us_per_token_k128=... full_mask_ms_mean=... full_mask_ms_max=... states=N/T`.
Usage: python -m benchmarks.matcher_speed [--problems problems/roman_numerals,...] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from policies.answer_grammar import AnswerShape
from policies.answer_matcher import AnswerMatcher
from policies.held_rows import HeldVocab, VocabTexts

KIND = "speed"
SMOKE_ARGS = ("--model", "{tiny_model}", "--problems", "problems/roman_numerals/seed.py")

DEFAULT_PROBLEMS = "problems/roman_numerals/seed.py,problems/roman_numerals_c/roman.c,problems/bin_packing/seed.py"
LANGUAGES = {"py": "python", "c": "c", "rs": "rust"}
SIZES = (2, 32, 128)


def answers(path: str) -> list[tuple[AnswerShape, str]]:
    """A `full` and a `diff` answer of three variants written from the program at `path`."""
    code = Path(path).read_text().rstrip("\n") + "\n"
    language = LANGUAGES[path.rsplit(".", 1)[1]]
    lines = code.splitlines(keepends=True)
    search = "".join(lines[:3])
    full = "\n\n".join(f"<variant {k}>\n```{language}\n{code}```\n</variant {k}>" for k in (1, 2, 3))
    edit = f"<<<<<<< SEARCH\n{search}=======\n# changed\n{search}>>>>>>> REPLACE\n"
    diff = "\n\n".join(f"<variant {k}>\n{edit}</variant {k}>" for k in (1, 2, 3))
    return [(AnswerShape(3, "full", language), full), (AnswerShape(3, "diff", language), diff)]


def per_token_us(texts: VocabTexts, shape: AnswerShape, ids: list[int], k: int, rng: np.random.Generator) -> float:
    row = HeldVocab(shape, texts).row()
    spent = 0.0
    for token in ids:
        candidates = np.concatenate([[token], rng.integers(0, len(texts.texts), k - 1)])
        start = time.perf_counter()
        assert row.allowed(candidates)[0], (token, texts.texts[token])
        row.accept(token)
        spent += time.perf_counter() - start
    return 1e6 * spent / len(ids)


def cold_full_masks(texts: VocabTexts, shape: AnswerShape, ids: list[int]) -> list[float]:
    """Milliseconds per whole-vocabulary mask, once per distinct state along the answer."""
    held = HeldVocab(shape, texts)
    row, seen, times = held.row(), set(), []
    for token in ids:
        if row.state not in seen:
            seen.add(row.state)
            start = time.perf_counter()
            mask = held.full_mask(row.state)
            times.append(1000 * (time.perf_counter() - start))
            assert mask[token]
        row.accept(token)
    return times


def main() -> None:
    from transformers import AutoTokenizer

    from policies.embedded import embedded_model_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=DEFAULT_PROBLEMS, help="comma-separated program files")
    ap.add_argument("--model", type=Path, default=None, help="a model folder's tokenizer (default: the embedded one)")
    args = ap.parse_args()
    model_dir = args.model or embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    eos = json.loads((model_dir / "generation_config.json").read_text()).get("eos_token_id", [])
    start = time.perf_counter()
    texts = VocabTexts.of(tokenizer, config["vocab_size"], [tokenizer.eos_token_id, *np.atleast_1d(eos).tolist()])
    decode_s = time.perf_counter() - start
    print(f"vocabulary of {len(texts.texts)} ids decoded in {decode_s:.1f} s", flush=True)
    rng = np.random.default_rng(0)
    per_k: dict[int, list[float]] = {k: [] for k in SIZES}
    masks: list[float] = []
    tokens = 0
    for path in args.problems.split(","):
        for shape, text in answers(path):
            ids = tokenizer(text, add_special_tokens=False).input_ids
            matcher = AnswerMatcher(shape)
            done = matcher.advance(matcher.start(), text)
            assert done is not None and matcher.complete(done), (path, shape)
            tokens += len(ids)
            row_us = {k: per_token_us(texts, shape, ids, k, rng) for k in SIZES}
            for k, us in row_us.items():
                per_k[k].append(us * len(ids))
            said = " ".join(f"k={k}: {us:.0f} us" for k, us in row_us.items())
            print(f"{path} {shape.edit_format}: {len(ids)} tokens, per token {said}", flush=True)
            if path == args.problems.split(",")[0]:
                times = cold_full_masks(texts, shape, ids)
                masks += times
                print(f"  full masks: {len(times)} states, {np.mean(times):.0f} ms mean, {max(times):.0f} max")
    rates = " ".join(f"us_per_token_k{k}={sum(v) / tokens:.0f}" for k, v in per_k.items())
    print(
        f"matcher_speed decode_s={decode_s:.1f} {rates} full_mask_ms_mean={np.mean(masks):.0f} "
        f"full_mask_ms_max={max(masks):.0f} states={len(masks)}"
    )


if __name__ == "__main__":
    main()
