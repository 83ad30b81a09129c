"""Stop strings that may span tokens: what to emit now, what to hold back.

Pure logic over text. A stop string can arrive split across any number of tokens, so the
tail of the text that could still be the start of a stop string is held back until the next
token decides it, exactly as llama-server does.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StopMatcher:
    stops: tuple[str, ...]
    _pending: str = field(default="", init=False)
    matched: str = field(default="", init=False)  # the stop string that ended the text

    def __post_init__(self) -> None:
        # Empty strings would match everywhere; the router rejects them, this keeps us safe.
        self.stops = tuple(s for s in self.stops if s)

    def feed(self, text: str) -> tuple[str, bool]:
        """Add newly decoded text. Returns (text safe to emit, whether a stop string matched).

        On a match, the emitted text ends right before the stop string and the matcher must
        not be fed again.
        """
        if not self.stops:
            return text, False
        buf = self._pending + text
        # Earliest match wins: that is where the output would have ended.
        cut = -1
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut, self.matched = i, s
        if cut != -1:
            self._pending = ""
            return buf[:cut], True
        hold = self._partial_suffix(buf)
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """The held-back text, when generation ends for another reason."""
        out, self._pending = self._pending, ""
        return out

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
