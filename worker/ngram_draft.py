"""Draft tokens for speculative decoding by n-gram lookup (no second model): the tokens that
followed the last time the sequence's latest n tokens occurred, in its prompt or its own
output. Agents that edit code repeat long spans of their input, and so do summaries and
rewrites; where the guess is right, one decode step verifies several tokens at once.

Pure and incremental: an index from each 3-gram (and 2-gram) to where it occurred, extended
with the tokens added since the last call; a lookup weighs the latest occurrences of the
sequence's last tokens by how far back each matches, so that a draft costs a few dict
lookups and short comparisons however long the prompt. How many tokens to draft adapts to how many the model
accepted lately (`Drafter`): a miss shrinks it to one token and pauses drafting for a while
(longer after each miss in a row), full acceptance grows it to `max_draft`.
"""

from __future__ import annotations

from typing import Sequence

KEY = 3  # an occurrence is found by its last KEY tokens, then its match extended backwards
N_MIN = 2  # a shorter key when the last KEY tokens occurred nowhere before
CANDIDATES = 16  # the latest occurrences of a key that are weighed
LONGEST = 64  # a match this long needs no longer one


class NgramIndex:
    def __init__(self) -> None:
        # key n-gram -> the indices just past each of its occurrences, in order
        self._at: dict[tuple[int, ...], list[int]] = {}
        self._seen = 0  # n-grams ending at or before this index are indexed

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the earlier occurrence of the sequence's end that
        matches the most tokens back (among the latest CANDIDATES occurrences of its last
        KEY tokens, or else of its last N_MIN), the latest among equals: code repeats short
        spans everywhere ("result += item."), and the longest match is the copy."""
        end = len(tokens) - 1  # the n-grams ending at len(tokens) are looked up, not indexed
        for e in range(max(self._seen + 1, N_MIN), end + 1):
            for n in (N_MIN, KEY):
                if e >= n:
                    self._at.setdefault(tuple(tokens[e - n : e]), []).append(e)
        self._seen = max(self._seen, end)
        if k <= 0:
            return []
        L = len(tokens)
        for n in (KEY, N_MIN):
            if L < n:
                continue
            found = self._at.get(tuple(tokens[L - n :]))
            if not found:
                continue
            best, best_len = found[-1], 0
            for e in reversed(found[-CANDIDATES:]):
                m = n
                while m < LONGEST and e - m - 1 >= 0 and tokens[e - m - 1] == tokens[L - m - 1]:
                    m += 1
                if m > best_len:
                    best, best_len = e, m
            return list(tokens[best : best + k])
        return []


class Drafter:
    """One request's n-gram drafts and how long they may be."""

    def __init__(self, max_draft: int) -> None:
        self.index = NgramIndex()
        self.max_draft = max_draft
        self.length = min(4, max_draft)  # the next draft's length, adapted to acceptance
        self.drafted = 0  # tokens drafted and verified so far
        self.accepted = 0  # of them, those the model agreed with
        # After a draft the model rejected outright, this many steps go without one,
        # doubling with each such miss: text that repeats nothing costs next to nothing.
        self.pause = 0
        self._backoff = 0

    def allowance(self, room: int) -> int:
        """How many tokens this step's draft may have (0 while paused; counts the pause)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return min(self.length, room)

    def draft(self, tokens: Sequence[int], room: int) -> list[int]:
        n = self.allowance(room)
        return self.index.lookup(tokens, n) if n > 0 else []

    def verified(self, drafted: int, accepted: int) -> None:
        """The model agreed with the first `accepted` of `drafted` tokens."""
        if not drafted:
            return
        self.drafted += drafted
        self.accepted += accepted
        if accepted == 0:
            self._backoff = min(2 * self._backoff + 1, 32)
            self.pause = self._backoff
        else:
            self._backoff = 0
        if accepted == drafted:
            self.length = min(self.max_draft, self.length * 2)
        else:
            self.length = max(1, min(self.length, accepted + 1))
