"""The answer's shape held while transformers samples: each row's token drawn in numpy among those the row's
matcher allows, and `generate` made to take it.

Why not a transformers logits processor that only masks: the stored logprob must be that of the distribution the
token was drawn from, and the mask is judged on the warped distribution's support (truncate, then constrain:
`policies.sampling.constrained_distribution`, as the llama.cpp policy does), which transformers' warper chain
cannot express. So `HeldSampler` is the only processor of a greedy `generate`: it draws each live row's token with
`TokenSampler.draw_held`, records its exact logprob, and returns a row of -inf but that token, which greedy
decoding then takes. The model's own processors (a repetition penalty in its generation config) still run
before it, as they do before the free-text sampler.

A token is judged by its text (`VocabTexts`, decoded once per vocabulary), through the pure-Python matcher of the
answer's language (`policies.answer_matcher`): llama.cpp's grammar engine needs a llama vocab, which a
transformers model does not have. An end-of-turn id is allowed only once the answer is complete; a special token
(a chat marker, a fill-in-the-middle marker) never, since the completion's text drops it while the matcher would
have read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policies.answer_grammar import AnswerShape
from policies.answer_matcher import AnswerMatcher, MatchState
from policies.copy_guard import RowGuard, both
from policies.llama_grammar import GrammarCost
from policies.policy import SamplingParams
from policies.sampling import TokenSampler
from policies.stops import RowStops

FULL_MASKS_KEPT = 64  # whole-vocabulary masks remembered per shape, by state (152k booleans each)
# The answer's language names only ASCII characters (tags, fences, markers, the fence's language tag): every other
# character leads from a state to the same state, so a full mask judges them as one, this one.
OTHER = "\x80"


def _kind(char: str) -> str:
    return char if char < OTHER else OTHER


@dataclass(frozen=True)
class VocabTexts:
    """Each token id's text as it reads inside a completion (None: never allowed: a special token, an id the
    tokenizer does not have, an empty piece), and the ids that end a turn."""

    texts: list[str | None]
    eos: frozenset[int]
    by_first: dict[str, np.ndarray] = field(default_factory=dict)  # ids of the texts by their first `_kind`
    newline: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # which texts hold a newline

    @classmethod
    def of(cls, tokenizer: Any, n_vocab: int, eos_ids: list[int]) -> VocabTexts:
        """Decoded once (about 3 s for a 152k vocabulary), each after an anchor token whose text is then cut
        off: a SentencePiece token decoded alone loses its leading space."""
        anchor = tokenizer("a", add_special_tokens=False).input_ids[-1:]
        head = len(tokenizer.decode(anchor, clean_up_tokenization_spaces=False))
        known = min(n_vocab, len(tokenizer))
        decoded = tokenizer.batch_decode(
            [[*anchor, i] for i in range(known)], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        special = set(tokenizer.all_special_ids) | {
            i for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if token.special
        }
        texts: list[str | None] = [t[head:] if i not in special and t[head:] else None for i, t in enumerate(decoded)]
        return cls.of_texts(texts + [None] * (n_vocab - known), eos_ids)

    @classmethod
    def of_texts(cls, texts: list[str | None], eos_ids: list[int]) -> VocabTexts:
        """The vocabulary whose id i reads `texts[i]` (None or "": never allowed)."""
        texts = [text or None for text in texts]
        by_first: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            if text is not None:
                by_first.setdefault(_kind(text[0]), []).append(i)
        newline = np.array([text is not None and "\n" in text for text in texts], dtype=bool)
        groups = {char: np.array(ids, dtype=np.int64) for char, ids in by_first.items()}
        return cls(texts, frozenset(eos_ids), groups, newline)


class HeldVocab:
    """One answer shape over one vocabulary: hands out rows, and remembers whole-vocabulary masks by state."""

    def __init__(self, shape: AnswerShape, vocab: VocabTexts) -> None:
        self.matcher, self.vocab = AnswerMatcher(shape), vocab
        self.eos_ids = np.array(sorted(vocab.eos), dtype=np.int64)
        self._masks: dict[MatchState, np.ndarray] = {}

    def row(self) -> HeldRow:
        return HeldRow(self, self.matcher.start())

    def full_mask(self, state: MatchState) -> np.ndarray:
        """Which ids of the whole vocabulary may come next. Tokens are judged in groups of the same first
        characters (any non-ASCII one counting as `OTHER`), as a trie would walk them: a prefix refused refuses
        its group; one that starts free code allows every token of the group without a newline in its rest, so
        only the others are judged further."""
        mask = self._masks.get(state)
        if mask is not None:
            return mask
        mask = np.zeros(len(self.vocab.texts), dtype=bool)
        for char, ids in self.vocab.by_first.items():
            after = self.matcher.advance(state, char)
            if after is None:
                continue
            if after.line is None:
                free = ~self.vocab.newline[ids]
                mask[ids[free]] = True
                self._judge(after, ids[~free].tolist(), 1, mask)
            else:
                self._judge(after, ids.tolist(), 1, mask)
        if self.matcher.complete(state):
            mask[self.eos_ids[self.eos_ids < len(mask)]] = True
        if len(self._masks) >= FULL_MASKS_KEPT:
            self._masks.pop(next(iter(self._masks)))
        self._masks[state] = mask
        return mask

    def _judge(self, state: MatchState, ids: list[int], depth: int, mask: np.ndarray) -> None:
        """Mark in `mask` which of `ids` may come next, all of whose texts open with the same `depth` characters,
        which lead to `state`."""
        texts, advance = self.vocab.texts, self.matcher.advance
        if state.line is None:  # free code: the rest of each text is judged from its first newline on
            for i in ids:
                rest = texts[i][depth:]  # type: ignore[index]
                mask[i] = "\n" not in rest or advance(state, rest) is not None
            return
        groups: dict[str, list[int]] = {}
        for i in ids:
            text = texts[i]
            if len(text) == depth:  # type: ignore[arg-type]
                mask[i] = True
            else:
                groups.setdefault(_kind(text[depth]), []).append(i)  # type: ignore[index]
        for char, group in groups.items():
            after = advance(state, char)
            if after is not None:
                self._judge(after, group, depth + 1, mask)


class HeldRow:
    """One row's place in the answer: `allowed` judges candidate ids, `accept` advances past the drawn one."""

    def __init__(self, held: HeldVocab, state: MatchState) -> None:
        self.held, self.state = held, state
        self.cost = GrammarCost()

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        held, texts = self.held, self.held.vocab.texts
        if ids.shape[0] == len(texts):
            ok = held.full_mask(self.state)[ids]
            self.cost.full_masks += 1
        elif held.matcher.complete(self.state):
            ok = np.isin(ids, held.eos_ids)
        else:
            advance, state = held.matcher.advance, self.state
            ok = np.array(
                [texts[i] is not None and advance(state, texts[i]) is not None for i in ids.tolist()], dtype=bool
            )
        self.cost.checks += 1
        self.cost.candidates += ids.shape[0]
        self.cost.seconds += time.perf_counter() - start
        return ok

    def accept(self, token: int) -> None:
        start = time.perf_counter()
        text = self.held.vocab.texts[token]
        after = None if text is None else self.held.matcher.advance(self.state, text)
        if after is None:
            raise ValueError(f"token {token} ({text!r}) was never allowed here")
        self.state = after
        self.cost.seconds += time.perf_counter() - start

    def close(self) -> None:
        """Nothing to free (a `RowGrammar` holds llama.cpp's state; this row only a value)."""


class HeldSampler:
    """The one logits processor of a greedy `generate` whose rows are held to their answer's shape.

    At each step, for every live row: the next token drawn among those the row allows (`TokenSampler.draw_held`
    on the scores transformers hands over), its logprob kept in `logprobs`, and a row of scores returned that is
    -inf but at that token. A row whose answer allows nothing more (no end-of-turn id in the model's vocabulary)
    ends where it stands, through `stops` as a stop string would end it."""

    def __init__(
        self,
        params: SamplingParams,
        rows: list[HeldRow],
        stops: RowStops,
        eos_ids: list[int],
        guards: list[RowGuard] | None = None,
    ) -> None:
        self.sampler, self.rows, self.stops, self.eos = TokenSampler(params), rows, stops, set(eos_ids)
        self.guards = guards  # a copy guard per row (policies/copy_guard.py), or None
        self.logprobs: list[list[float]] = [[] for _ in rows]
        self.done: set[int] = set()

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        forced = torch.full_like(scores, float("-inf"))
        logits = scores.detach().float().cpu().numpy()
        kept = input_ids.shape[1] - self.stops.prompt_len  # tokens generated before this step
        for r, row in enumerate(self.rows):
            if r in self.done or r in self.stops.ended:
                continue
            guard = self.guards[r] if self.guards else None
            turned = guard.turn(logits[r], self.sampler.params.temperature, row.allowed) if guard is not None else None
            drawn = self.sampler.draw_held(logits[r], both(row.allowed, turned) or row.allowed)
            if drawn is None:
                self.stops.ended[r], self.stops.reasons[r] = kept, "stop"
                self.done.add(r)
                continue
            token, logprob = drawn
            forced[r, token] = 0.0
            self.logprobs[r].append(logprob)
            if token in self.eos:
                self.done.add(r)
            else:
                row.accept(token)
                if guard is not None:
                    guard.accept(token)
        return forced

    def row_logprobs(self) -> list[Any]:
        """Each row's logprobs as a float64 tensor, exactly as drawn."""
        import torch

        return [torch.tensor(lps, dtype=torch.float64) for lps in self.logprobs]

    def cost(self) -> GrammarCost:
        total = GrammarCost()
        for row in self.rows:
            total.add(row.cost)
        return total
