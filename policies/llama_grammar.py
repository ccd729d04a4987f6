"""One grammar state per row, in llama.cpp's own grammar engine: which of some token ids may come next.

Why llama.cpp's engine (through its grammar sampler, `llama_sampler_init_grammar`): it ships in the wheel the
llama policy already loads, takes GBNF (policies/answer_grammar.py), and reads the model's own token pieces,
so a token that spans a tag and a newline is judged as the text it is. Only its mask is used: tokens are still
drawn in numpy (policies/sampling.py), so the stored logprobs stay those of the distribution drawn from.

A grammar is parsed once per shape; each row of a group gets a clone of the parsed state and advances it with
every token it samples. llama.cpp aborts the process when a state is advanced by a token it rejects, so
`accept` takes only tokens `allowed` said yes to (the sampler draws only among those).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.policy import PolicyError

# llama_token_data as numpy sees it: the candidates handed to the grammar are a view of this array.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


@dataclass
class GrammarCost:
    """Where the grammar's time goes, summed over the calls of one policy: for the benchmark's report."""

    checks: int = 0  # candidate sets judged (one per constrained token, plus one per full mask)
    candidates: int = 0  # token ids judged in them
    full_masks: int = 0  # whole-vocabulary masks (no candidate of the warped distribution was allowed)
    seconds: float = 0.0  # inside llama.cpp's grammar: judging candidates and advancing states

    def add(self, other: GrammarCost) -> None:
        self.checks += other.checks
        self.candidates += other.candidates
        self.full_masks += other.full_masks
        self.seconds += other.seconds


class GrammarBook:
    """The parsed grammars of one model's vocabulary, by GBNF text; `row` hands out a fresh state."""

    def __init__(self, lib: Any, vocab: Any, n_vocab: int, eos_ids: Iterable[int]) -> None:
        self.lib, self.vocab, self.n_vocab, self.eos_ids = lib, vocab, n_vocab, set(eos_ids)
        self._parsed: dict[str, Any] = {}
        self._never: np.ndarray | None = None

    def never(self) -> np.ndarray:
        """The ids never allowed: the grammar allows llama.cpp's end-of-generation tokens only once the answer is
        complete, and the policy ends a row at its own end-of-turn ids, so a token that is one and not the other
        is refused. An end-of-turn id llama.cpp does not count would be judged as its text ("<|eos|>" as code)
        and end a row inside its answer; an end-of-generation token the policy does not end at would be taken
        after a complete answer, again and again, until the row's length. Asked of the whole vocabulary once
        (0.1-0.4 s), on the first structured call."""
        if self._never is None:
            eog = {i for i in range(self.n_vocab) if self.lib.llama_vocab_is_eog(self.vocab, i)}
            self._never = np.array(sorted(self.eos_ids ^ eog), dtype=np.int64)
        return self._never

    def row(self, gbnf: str) -> RowGrammar:
        template = self._parsed.get(gbnf)
        if template is None:
            template = self.lib.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
            if not template:
                raise PolicyError("llama.cpp could not parse the answer grammar:\n" + gbnf)
            self._parsed[gbnf] = template
        return RowGrammar(self.lib, self.lib.llama_sampler_clone(template), self.n_vocab, self.never())

    def close(self) -> None:
        for template in self._parsed.values():
            self.lib.llama_sampler_free(template)
        self._parsed.clear()


class RowGrammar:
    """One row's position in its grammar: `allowed` judges candidates, `accept` advances past a token."""

    def __init__(self, lib: Any, sampler: Any, n_vocab: int, never: np.ndarray) -> None:
        self.lib, self.sampler, self.n_vocab, self.never = lib, sampler, n_vocab, never
        self.cost = GrammarCost()

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """A boolean per id of `ids`: may it come next? All of the vocabulary's ids are one full mask."""
        start = time.perf_counter()
        candidates = np.zeros(ids.shape[0], dtype=TOKEN_DATA)
        candidates["id"] = ids
        array = self.lib.llama_token_data_array(
            candidates.ctypes.data_as(self.lib.llama_token_data_p), ids.shape[0], -1, False
        )
        self.lib.llama_sampler_apply(self.sampler, ctypes.byref(array))
        ok = candidates["logit"] != -np.inf
        if self.never.size:
            ok &= ~np.isin(ids, self.never)
        self.cost.checks += 1
        self.cost.candidates += ids.shape[0]
        self.cost.full_masks += ids.shape[0] == self.n_vocab
        self.cost.seconds += time.perf_counter() - start
        return ok

    def accept(self, token: int) -> None:
        start = time.perf_counter()
        self.lib.llama_sampler_accept(self.sampler, token)
        self.cost.seconds += time.perf_counter() - start

    def close(self) -> None:
        if self.sampler:
            self.lib.llama_sampler_free(self.sampler)
            self.sampler = None
