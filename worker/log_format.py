"""How Corral's processes write their logs: `text` lines, or `json`, one object a line.

`corral serve` and its workers write to the same stream (a worker inherits the server's
stderr), so both use this module, and the server tells its workers the format and the level
through the environment (ENV, LEVEL_ENV; hand_down), which every worker inherits: `serve
--log-level warning` quiets the workers too, and `corral chat`'s workers write nothing
under its prompt but warnings. A JSON line holds the time, level, logger
and message, the model for a worker's lines, and any `fields` a record carries (an access
log line's request id, status, tokens and times).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone
from typing import Literal

ENV = "CORRAL_LOG_FORMAT"
LEVEL_ENV = "CORRAL_LOG_LEVEL"
LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    def __init__(self, model: str | None = None) -> None:
        super().__init__()
        self.model = model

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.model is not None:
            obj["model"] = self.model
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            obj.update(fields)
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str)


def configure(level: int, fmt: str, model: str | None = None) -> None:
    """Log to stderr in `fmt` ("text" or "json"); `model` names a worker's lines."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(model))
    else:
        who = f"worker[{model}]" if model is not None else "%(name)s"
        handler.setFormatter(logging.Formatter(f"%(asctime)s {who} %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def hand_down(level: int, fmt: str) -> None:
    """Have the workers this process spawns log at `level` in `fmt`."""
    os.environ[ENV] = fmt
    os.environ[LEVEL_ENV] = logging.getLevelName(level)


def level_from_environment() -> int:
    """The level hand_down gave this worker; INFO when none (a worker started by hand)."""
    level = logging.getLevelName(os.environ.get(LEVEL_ENV, "INFO").upper())
    return level if isinstance(level, int) else logging.INFO


def from_environment() -> str:
    return "json" if os.environ.get(ENV) == "json" else "text"
