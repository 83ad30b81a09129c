"""The one error hierarchy. Each class maps to exactly one HTTP status and OpenAI error
type/code, in router/server/errors.py; nothing else decides how an error looks on the wire."""

from __future__ import annotations


class CorralError(Exception):
    """Base: `message` is shown to the client; `param` names the offending request field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(CorralError):
    """The request itself is wrong (400)."""


class Unsupported(CorralError):
    """The model cannot do what was asked, e.g. chat without a template (400)."""


class NotServed(CorralError):
    """A route the config turned off, such as /slots (501, llama-server's not_supported_error)."""


class ContextOverflow(CorralError):
    """The prompt does not fit the model's context (400 context_length_exceeded).

    `n_prompt_tokens` and `n_ctx`, where known, are what llama-server's error shape reports:
    the prompt's tokens (a lower bound when it was refused by its length alone) and the
    context it had to fit."""

    def __init__(
        self, message: str, param: str | None = None, n_prompt_tokens: int | None = None, n_ctx: int | None = None
    ) -> None:
        super().__init__(message, param)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class Unauthorized(CorralError):
    """No API key, or one that is not configured (401 invalid_api_key)."""


class Forbidden(CorralError):
    """A valid key, or a client, that may not use this route (403)."""


class NotFound(CorralError):
    """No such object (a stored response, by its id): 404."""


class ModelNotFound(NotFound):
    """No model or alias by that name (404)."""


class WorkerUnavailable(CorralError):
    """The model could not be loaded or is refusing work (503)."""

    def __init__(self, message: str, retry: bool = True, retry_after: float | None = None) -> None:
        super().__init__(message, None)
        self.retry = retry
        self.retry_after = retry_after  # seconds, sent as Retry-After


class Overloaded(CorralError):
    """The model's line for a slot is full (429 rate_limit_error, with Retry-After)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message, None)
        self.retry_after = retry_after


class QuotaExceeded(Overloaded):
    """A key past one of its quotas (429, with Retry-After; router/usage/quotas.py).
    `limit` names the rule: "tokens_per_minute"."""

    def __init__(self, message: str, retry_after: float, limit: str) -> None:
        super().__init__(message, retry_after)
        self.limit = limit


class WorkerCrashed(CorralError):
    """The worker died or broke the protocol while a request was in flight (502)."""


class InsufficientStorage(CorralError):
    """No room for what a request would write: a slot file past the slot folder's bound,
    or a full disk (507, WebDAV's Insufficient Storage)."""


class InternalError(CorralError):
    """A bug on our side (500)."""
