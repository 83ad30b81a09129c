"""What a sequence's KV cells must hold, and when a cached prefix can be kept: pure rules.

A slot's `cache` (worker/slots.py) lists the tokens at positions 0 .. n-1 of its sequence.
The KV cache keeps the same fact in its own cells, and the two must agree, or the model
answers from a context that is not the one the slot believes (silently: a 200 with wrong
text). What "agree" means depends on the model's memory:

- Plain attention: the cells hold exactly positions 0 .. n-1. llama.cpp's public API
  reports a sequence's lowest and highest cached position (`llama_memory_seq_pos_min/max`).
- Sliding-window attention (gemma-2/3, and most recent models, mixed with full-attention
  layers: llama.cpp's iSWA memory, two caches): the full-attention cache holds 0 .. n-1,
  but the sliding-window cache may have given away cells whose positions have left the
  window: llama.cpp's slot search reuses such cells for any sequence's new tokens, even
  with `swa_full` and free cells elsewhere, and then purges that sequence's positions below
  them, so that each sequence's range stays contiguous (llama-kv-cache.cpp, apply_ubatch).
  The API reports the sliding-window cache's range (the full one is a superset). Decoding
  position n needs that range to reach down to the window of n. Keeping only a prefix of
  `keep` tokens needs it to reach down to the window of `keep`, which cells that have left
  the window of n may no longer do: that is issue 20's corruption, where a 4-token prefix
  was kept from a sequence whose sliding-window cells started at 211.
- Chunked attention (llama4): the window is the current chunk of n_swa positions.
- Recurrent and hybrid memories (mamba, rwkv, jamba, ...): one state per sequence, at its
  last position. Only the whole of it can be continued; no shorter prefix can be kept.

The engine (worker/kv_cache.py) asks these questions with the positions the API reports.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attention:
    """How far back a model's layers look, as far as its KV cells are concerned."""

    n_swa: int = 0  # the sliding window's size; 0: every layer sees every earlier position
    chunked: bool = False  # llama4: the window is the current chunk, not the last n_swa
    recurrent: bool = False  # recurrent or hybrid memory: one state per sequence
    mrope: bool = False  # M-RoPE (Qwen2-VL family): images take fewer positions than tokens

    def lowest_needed(self, n: int) -> int:
        """The lowest position whose cells decoding position `n` reads in the layers whose
        range the API reports (the sliding-window ones, where there are any)."""
        if self.recurrent:
            return max(n - 1, 0)  # the state after the last position is all there is
        if self.n_swa <= 0:
            return 0
        if self.chunked:
            return (n // self.n_swa) * self.n_swa
        # llama_hparams::is_masked_swa, LLAMA_SWA_TYPE_STANDARD: position p0 is hidden from
        # p1 when p1 - p0 >= n_swa.
        return max(n - self.n_swa + 1, 0)

    def keepable(self, keep: int, cached: int, pos_min: int) -> bool:
        """Whether the first `keep` of a sequence's `cached` tokens can be kept and decoding
        go on from position `keep`, given the lowest position its cells report now.

        Keeping all of them is continuing, which the invariant (`problem`) already vouches
        for. A shorter prefix needs cells reaching down to its own window; the rule is
        llama-server's (server-context.cpp: `pos_min > max(0, n_past - n_swa)` forces a full
        re-evaluation), one position stricter than the exact window, as it is there."""
        if keep <= 0:
            return True
        if keep >= cached:
            return True
        if self.recurrent:
            return False
        if pos_min < 0:  # no cells at all: only a prefix that needs none of them
            return self.lowest_needed(keep) >= keep
        if self.n_swa <= 0:
            return pos_min == 0
        return pos_min <= max(0, keep - self.n_swa)

    def problem(self, cached: int, pos_min: int, pos_max: int, last: int | None = None) -> str | None:
        """What is wrong when a slot believes it holds `cached` tokens and the KV cache
        reports positions pos_min .. pos_max for its sequence (-1, -1: none); None when
        the two agree. For an M-RoPE model, `cached` is the next position and `last` the
        highest one the books say the cells hold (worker/kv_positions.py)."""
        if cached == 0:
            if pos_max == -1:
                return None
            return f"the slot holds no tokens, but the KV cache holds positions {pos_min}..{pos_max}"
        if pos_max == -1:
            # When the next token sees no earlier position in the sliding layers (a chunk
            # boundary), every cell may have been given away, and none is needed.
            if self.lowest_needed(cached) >= cached:
                return None
            return f"the slot holds {cached} tokens, but the KV cache holds none of its positions"
        if pos_max != (cached - 1 if last is None else last):
            return f"the slot holds {cached} tokens, but the KV cache's last position is {pos_max}"
        needed = self.lowest_needed(cached)
        if pos_min > needed:
            return (
                f"the slot holds {cached} tokens and the next one needs positions from {needed}, "
                f"but the KV cache holds them from {pos_min} only"
            )
        return None
