"""How Corral's processes write their logs: `text` lines, or `json`, one object a line.

`corral serve` and its workers write to the same stream (a worker inherits the server's
stderr), so both use this module, and the server tells its workers the format through the
environment (ENV), which every worker inherits. A JSON line holds the time, level, logger
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


def from_environment() -> str:
    return "json" if os.environ.get(ENV) == "json" else "text"
