"""A thin typed layer over llama-cpp-python's low-level API: one model, one context, its sequences.

Only what the llama policy needs, so that the policy reads as sampling logic rather than ctypes: decode a
batch of (token, position, sequence) entries and get back the logits of the entries that asked for them;
copy, trim and drop sequences of the KV cache; swap a LoRA adapter; stop a decode between two graph nodes.

The context uses one unified KV cache for all sequences: copying the prompt's sequence to G row sequences
then only tags the prompt's cells with more sequence ids, so the prompt's cache is shared, never copied.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies.build_lock import build_once
from policies.policy import PolicyError

INSTALL_HINT = "pip install 'vpo-evolve[llama]' (builds llama.cpp from source, about 13 minutes on 2 cores)"


def llama_module() -> Any:
    """The low-level llama-cpp-python module, or a PolicyError saying how to install it.

    llama.cpp's threads meet at OpenMP barriers; by default a waiting thread spins. On a machine whose cores
    are shared with other work that is ruinous (measured here under a load of 6 on 2 cores: a decoding step of
    one row took 476 ms spinning, 84 ms with passive waits), so waiting threads sleep unless the user says
    otherwise. It must be set before the OpenMP runtime loads, i.e. before the first import."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        import llama_cpp.llama_cpp as lib
    except (ImportError, OSError) as exc:
        raise PolicyError(f"the llama policy needs llama-cpp-python ({exc}); {INSTALL_HINT}") from None
    return lib


def default_threads() -> int:
    """EVOLVE_LLAMA_THREADS, else every core this process may use (decoding is memory-bound: more threads
    than cores only contend)."""
    configured = os.environ.get("EVOLVE_LLAMA_THREADS")
    if configured:
        return max(1, int(configured))
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


LLAMA_FTYPE_MOSTLY_Q8_0 = 7


def requantize_q8_0(source: Path, target: Path) -> Path:
    """`source` re-encoded as Q8_0, written once (about 10 s) and reused.

    Why: the embedded model ships as Q4_K_M, whose k-quant kernels have no fast batched path on AVX2, so
    decoding G rows costs nearly G single-row steps and the prompt decodes at ~45 tok/s. Q8_0 has both
    (llamafile's batched kernels): measured here on 2 cores, the prompt at ~130 tok/s and a step of 4 rows in
    ~85 ms against ~280 ms. Q8_0 holds the 4-bit values to within a few percent of one 4-bit step, so the
    model sampled stays the one the trainer loads (the same GGUF, dequantised)."""

    def quantize(staging: Path) -> None:
        lib = llama_module()
        params = lib.llama_model_quantize_default_params()
        params.nthread = default_threads()
        params.ftype = LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True
        code = lib.llama_model_quantize(str(source).encode(), str(staging).encode(), params)
        if code != 0:
            raise PolicyError(f"llama.cpp could not re-encode {source} as Q8_0 (code {code})")

    return build_once(target, "the model's Q8_0 copy", quantize, target.is_file)


@dataclass(frozen=True)
class Entry:
    """One token of a decode batch: its id, its position in its sequence, the sequence, and whether its logits
    are wanted."""

    token: int
    pos: int
    seq: int
    logits: bool


GGML_TYPE_F32 = 0
LLAMA_FLASH_ATTN_TYPE_DISABLED = 0


class DecodeAborted(Exception):
    """A decode was stopped by the abort flag; the cells it wrote are in an unknown state."""


_quiet_log: Any = None


# What llama.cpp logs as errors when a decode is stopped by the abort flag: a cut or Ctrl-C, not a failure.
ABORT_SIGNS = (b"failed with error 1", b"compute status: 1", b"failed to decode, ret = 2")


def _silence(lib: Any) -> None:
    """llama.cpp logs every load to stderr, which the live view owns; keep only its errors."""
    global _quiet_log
    if _quiet_log is None:

        def log(level: int, text: bytes, _data: Any) -> None:
            if level == 4 and text and not any(sign in text for sign in ABORT_SIGNS):  # GGML_LOG_LEVEL_ERROR
                os.write(2, text)

        _quiet_log = lib.llama_log_callback(log)
        lib.llama_log_set(_quiet_log, ctypes.c_void_p(0))


class LlamaRuntime:
    """One loaded GGUF model with one context of `n_ctx` cells shared by up to `n_seq` sequences.

    `threads`: a count, or a function asked before every decode call (llama.cpp takes a new count between two
    calls: policies/core_share.py gives back cores to evaluations that way)."""

    def __init__(self, path: Path, threads: int | Callable[[], int], abort: threading.Event) -> None:
        self.lib = lib = llama_module()
        _silence(lib)
        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise PolicyError(f"llama.cpp cannot load {path}; is it a GGUF model file?")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_layer = int(lib.llama_model_n_layer(self.model))
        self.thread_count: Callable[[], int] = threads if callable(threads) else lambda: threads
        self.threads, self.abort = self.thread_count(), abort
        self._threads_set = 0  # what the context decodes with now (0: not set since it was made)
        # A float32 model (the tests' tiny ones) keeps a float32 KV cache and plain attention, so that its logits
        # are the torch model's to float32 rounding (1e-5; CPU flash attention computes in float16, 1e-3 off);
        # a quantised model keeps llama.cpp's defaults: a float16 cache (half the memory), flash attention.
        self.exact = self._meta("general.file_type") == "0"
        self.ctx: Any = None
        self.n_ctx = self.n_seq = 0
        self._adapter: Any = None
        self._abort_cb = lib.ggml_abort_callback(lambda _data: abort.is_set())
        self._batch: Any = None
        self._batch_size = 0
        # Held by every call into the context: the loop of a stopping run stops waiting for a decode in flight on a
        # worker thread and closes the policy, which must not free the context under that decode (it segfaulted).
        self._lock = threading.RLock()

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(64)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    # ---- context ----------------------------------------------------------------------------------------
    def ensure_context(self, cells: int, sequences: int, n_batch: int = 512) -> bool:
        """A context with at least `cells` KV cells and `sequences` sequence ids; True when it was (re)made,
        which empties the cache."""
        with self._lock:
            self._live()
            if self.ctx is not None and self.n_ctx >= cells and self.n_seq >= sequences:
                return False
            lib = self.lib
            if self.ctx is not None:
                lib.llama_free(self.ctx)
                self.ctx = None
            params = lib.llama_context_default_params()
            params.n_ctx = self.n_ctx = max(cells, self.n_ctx, 2048) + 1023 & ~1023
            params.n_seq_max = self.n_seq = max(sequences, self.n_seq)
            params.n_batch = params.n_ubatch = n_batch
            params.n_threads = params.n_threads_batch = self.threads
            self._threads_set = 0
            params.kv_unified = True
            if self.exact:
                params.type_k = params.type_v = GGML_TYPE_F32
                params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED
            params.no_perf = True
            self.ctx = lib.llama_init_from_model(self.model, params)
            if not self.ctx:
                raise PolicyError(f"llama.cpp could not make a context of {self.n_ctx} cells (out of memory?)")
            self._apply_adapter()
            return True

    def _memory(self) -> Any:
        return self.lib.llama_get_memory(self.ctx)

    def clear(self) -> None:
        with self._lock:
            self._live()
            self.lib.llama_memory_clear(self._memory(), True)

    def trim(self, seq: int, keep: int) -> None:
        """Drop the cells of `seq` at positions `keep` and later (all of them when `keep` is 0)."""
        with self._lock:
            self._live()
            self.lib.llama_memory_seq_rm(self._memory(), seq, keep, -1)

    def copy(self, source: int, target: int) -> None:
        with self._lock:
            self._live()
            self.lib.llama_memory_seq_cp(self._memory(), source, target, -1, -1)

    # ---- decoding ---------------------------------------------------------------------------------------

    def decode(self, entries: Sequence[Entry]) -> np.ndarray:
        """Run the entries through the model; the logits of those that asked, in order, as (k, n_vocab)."""
        with self._lock:
            self._live()
            lib = self.lib
            if len(entries) > self._batch_size:
                if self._batch is not None:
                    lib.llama_batch_free(self._batch)
                self._batch_size = max(len(entries), 64)
                self._batch = lib.llama_batch_init(self._batch_size, 0, 1)
            batch = self._batch
            batch.n_tokens = len(entries)
            threads = self.thread_count()
            if threads != self._threads_set:  # a plain setter, taken by the next graph computed
                lib.llama_set_n_threads(self.ctx, threads, threads)
                self._threads_set = threads
            for i, e in enumerate(entries):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = e.token, e.pos, 1
                batch.seq_id[i][0], batch.logits[i] = e.seq, int(e.logits)
            code = lib.llama_decode(self.ctx, batch)
            if code == 2 or (code != 0 and self.abort.is_set()):
                raise DecodeAborted()
            if code != 0:
                raise PolicyError(f"llama.cpp decode failed with code {code} (context of {self.n_ctx} cells)")
            wanted = sum(e.logits for e in entries)
            if not wanted:
                return np.zeros((0, self.n_vocab), dtype=np.float32)
            pointer = lib.llama_get_logits(self.ctx)
            return np.ctypeslib.as_array(pointer, shape=(wanted, self.n_vocab)).copy()

    def prefill(self, tokens: Sequence[int], seq: int, start: int, chunk: int) -> np.ndarray:
        """Decode `tokens` at positions `start`... into `seq`, `chunk` at a time; the last token's logits.

        A chunk takes seconds, so the abort flag is watched inside it (llama.cpp asks after every graph node).
        Only here: the callback takes the GIL at each of a step's ~1000 nodes, which a decoding step of
        tens of milliseconds should not pay; steps are checked between them instead."""
        with self._lock:
            self._live()
            logits = np.zeros((0, self.n_vocab), dtype=np.float32)
            self.lib.llama_set_abort_callback(self.ctx, self._abort_cb, ctypes.c_void_p(0))
            try:
                for lo in range(0, len(tokens), chunk):
                    part = tokens[lo : lo + chunk]
                    last = lo + len(part) == len(tokens)
                    entries = [Entry(t, start + lo + i, seq, last and i == len(part) - 1) for i, t in enumerate(part)]
                    logits = self.decode(entries)
            finally:
                self.lib.llama_set_abort_callback(self.ctx, self.lib.ggml_abort_callback(), ctypes.c_void_p(0))
            return logits[-1]

    # ---- adapters ---------------------------------------------------------------------------------------

    def load_adapter(self, path: Path) -> None:
        """Serve the GGUF LoRA adapter at `path` (scale 1) instead of the current one; None-safe on failure."""
        with self._lock:
            self._live()
            adapter = self.lib.llama_adapter_lora_init(self.model, str(path).encode())
            if not adapter:
                raise PolicyError(f"llama.cpp cannot load the LoRA adapter {path}")
            old, self._adapter = self._adapter, adapter
            self._apply_adapter()
            if old:
                self.lib.llama_adapter_lora_free(old)

    def drop_adapter(self) -> None:
        with self._lock:
            self._live()
            old, self._adapter = self._adapter, None
            self._apply_adapter()
            if old:
                self.lib.llama_adapter_lora_free(old)

    def _apply_adapter(self) -> None:
        if self.ctx is None:
            return
        lib = self.lib
        if self._adapter:
            adapters = (lib.llama_adapter_lora_p_ctypes * 1)(self._adapter)
            scales = (ctypes.c_float * 1)(1.0)
            code = lib.llama_set_adapters_lora(self.ctx, adapters, 1, scales)
        else:
            code = lib.llama_set_adapters_lora(self.ctx, None, 0, None)
        if code != 0:
            raise PolicyError(f"llama.cpp could not apply the LoRA adapter (code {code})")

    def held(self) -> threading.RLock:
        """The runtime's lock, for a caller whose work between calls (a row's grammar) needs the model alive."""
        return self._lock

    def _live(self) -> None:
        if not self.model:
            raise PolicyError("the llama.cpp model was closed (the run is stopping)")

    def close(self) -> None:
        """Free the model and context once no call is inside them: a prefill in flight is aborted at its next graph
        node, a decoding step ends in tens of milliseconds; later calls raise PolicyError instead of crashing."""
        self.abort.set()
        with self._lock:
            self._free()

    def _free(self) -> None:
        lib = self.lib
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self.ctx is not None:
            lib.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            lib.llama_model_free(self.model)
            self.model = None
