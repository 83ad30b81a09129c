"""Stands in for the `llama-server` binary for the baseline: the real one, with models
named by Hugging Face repository replaced by $PEER_MODEL, the GGUF Corral serves too."""

from __future__ import annotations

import os
import sys

from tests.peer.llama_flags import hf_to_local


def main(argv: list[str]) -> None:
    binary = os.environ["PEER_LLAMA_SERVER"]
    args = hf_to_local(argv, os.environ["PEER_MODEL"])
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
