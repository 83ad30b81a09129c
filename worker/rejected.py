"""A request refused before it takes a slot, with the Error frame's fields ready to emit.

Its own module because the preparer's stages (prompts.py, constraint.py) raise it and
request.py keeps the requests they build; neither needs the other for it."""

from __future__ import annotations

from worker.protocol import ErrorCode


class RequestRejected(Exception):
    """The request cannot be served as sent: its Error frame, ready to emit."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        param: str | None = None,
        n_prompt_tokens: int | None = None,
        n_ctx: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param
        # A context overflow's counts, which llama-server's error shape reports.
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx
