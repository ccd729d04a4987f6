"""A model's one-time preparation, written to a log file in the model cache; the terminal gets one line.

Why: the first run joins the embedded model, re-encodes it (llama.cpp's quantizer loads it and logs each of its
~300 tensors) and converts it for transformers (three tqdm bars): about 330 lines in the terminal before the run's
own first line, which buried what the run says about itself. They are still worth keeping when a build fails, so
they go to `build.log` next to the model cache, and the terminal says once what is being prepared and where its log
is. The redirection is of file descriptors 1 and 2 (llama.cpp and ggml write from C, tqdm from Python), for the
preparation only: it runs before the live view starts, and anything raised comes out after they are restored.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from policies.build_lock import FIX
from policies.policy import PolicyError

LOG_NAME = "build.log"
_held = threading.local()  # a preparation inside another one (the transformers copy inside the embedded model's)


def build_log(cache: Path) -> Path:
    return cache / LOG_NAME


@contextlib.contextmanager
def quiet_build(cache: Path, what: str, needed: bool) -> Iterator[None]:
    """While the body prepares `what` (when `needed`), its output goes to the cache's build log; one line says so."""
    if not needed or getattr(_held, "depth", 0):
        yield
        return
    log = build_log(cache)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise PolicyError(f"{log}: cannot write the build log ({exc.strerror}); {FIX}") from None
    print(f"preparing {what}, once (a minute or more); its log: {log}", file=sys.stderr, flush=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    os.write(sink, f"\n==== {stamp} preparing {what} (pid {os.getpid()})\n".encode())
    _held.depth = 1
    with _descriptors_to(sink), _no_progress_bars():
        try:
            yield
        finally:
            _held.depth = 0
    os.close(sink)


@contextlib.contextmanager
def _descriptors_to(sink: int) -> Iterator[None]:
    """stdout and stderr, at the descriptor level, into `sink`; restored however the body ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' and huggingface_hub's tqdm bars off while the body runs (in the log they would be noise)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
