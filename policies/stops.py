"""Ending one row of a batched `generate` early, while the other rows go on.

A group is decoded as one batch, so it costs as many steps as its longest row. On a CPU a small model often
keeps writing after its last answer (a fourth variant nobody asked for, an explanation) or falls into a loop
that repeats a few tokens until `max_new_tokens`. Both cost the whole group minutes and add nothing the parser
keeps. `RowStops` ends such a row at the step it happens and remembers where, so that the completion is cut
exactly there: the tokens and logprobs kept are the ones sampled, nothing after.
"""

from __future__ import annotations

from typing import Any

STOP_TAIL_TOKENS = 24  # tokens decoded at the end of a row to look for a stop string
REPEAT_WINDOW = 96  # a row whose last 96 tokens are one short pattern repeated is a loop...
REPEAT_MAX_PERIOD = 24  # ...when that pattern is at most 24 tokens long (so it repeats at least 4 times)


def repeats_itself(tail: list[int], max_period: int = REPEAT_MAX_PERIOD) -> bool:
    """True when `tail` is a pattern of at most `max_period` tokens repeated to its full length."""
    return any(tail[p:] == tail[:-p] for p in range(1, min(max_period, len(tail) // 2) + 1))


class RowStops:
    """A stopping criterion: a row ends once its text holds a stop string or it repeats itself.

    transformers asks it after every step with the whole batch and drops each row it answers True for (the
    row is padded from then on). `ended[i]` is then the number of generated tokens row i keeps and `reasons[i]`
    why it ended; rows absent from `ended` ran until EOS or `max_new_tokens`.
    """

    def __init__(self, tokenizer: Any, prompt_len: int, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer, self.prompt_len, self.stop = tokenizer, prompt_len, tuple(s for s in stop if s)
        self.ended: dict[int, int] = {}
        self.reasons: dict[int, str] = {}

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        generated = input_ids.shape[1] - self.prompt_len
        for row in range(input_ids.shape[0]):
            if row in self.ended:
                done[row] = True
                continue
            reason = self._reason(input_ids[row, self.prompt_len :])
            if reason:
                self.ended[row], self.reasons[row] = generated, reason
                done[row] = True
        return done

    def _reason(self, new: Any) -> str | None:
        return end_reason(self.tokenizer, new.tolist(), self.stop)


def end_reason(tokenizer: Any, new: list[int], stop: tuple[str, ...]) -> str | None:
    """Why a row whose generated tokens so far are `new` ends now: "stop" (its tail holds a stop string),
    "repetition" (it loops), or None to go on. Shared by every in-process backend."""
    if stop and new:
        tail = tokenizer.decode(new[-STOP_TAIL_TOKENS:], skip_special_tokens=True)
        if any(s in tail for s in stop):
            return "stop"
    if len(new) >= REPEAT_WINDOW and repeats_itself(new[-REPEAT_WINDOW:]):
        return "repetition"
    return None
