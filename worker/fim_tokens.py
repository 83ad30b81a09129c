"""A vocabulary's fill-in-the-middle tokens, which llama-server's /infill lays a prompt out
with (worker/infill.py). Read from the GGUF by llama.cpp (llama_vocab_fim_*)."""

from __future__ import annotations

from dataclasses import dataclass

NO_TOKEN = -1


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle tokens; NO_TOKEN where it has none."""

    pre: int = NO_TOKEN
    suf: int = NO_TOKEN
    mid: int = NO_TOKEN
    rep: int = NO_TOKEN
    sep: int = NO_TOKEN

    def missing(self) -> str:
        """Why /infill cannot run, in llama-server's words ("" when it can)."""
        words = {"prefix": self.pre, "suffix": self.suf, "middle": self.mid}
        return "".join(f"{name} token is missing. " for name, tok in words.items() if tok == NO_TOKEN)
