"""`GET /health?model=NAME`: whether one model can serve, for a balancer or a readiness probe.

`/health` alone says the server answers (llama-server's meaning). A balancer in front of
several Corral hosts needs more: whether *this* host can serve *this* model. It answers
200 while the model is loaded, loading, or not loaded but loadable (Corral loads on the
first request, so an unloaded model is ready to serve), and 503 while it cannot: its last
load failed for good (`failed`), or it is waiting to try again (`backoff`), with
Retry-After for the latter. A model it does not serve is 404, naming `model`; an alias
answers for its model. `unknown_model = "default"` does not apply: a probe that names a
model asks about that model.
"""

from __future__ import annotations

import math

import msgspec
import trio
from quart import Response

from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor, unknown_model

_json = msgspec.json.Encoder()

# The states in which a request to the model would fail at once, or wait for a retry.
UNAVAILABLE = frozenset({State.FAILED, State.BACKOFF})


def model_health(supervisor: Supervisor, model: str) -> Response:
    spec = supervisor.config.resolve(model)
    if spec is None:
        raise unknown_model(model)
    handle = supervisor.handles[spec.name]
    state = handle.state
    ok = state not in UNAVAILABLE
    body = {"status": "ok" if ok else "unavailable", "model": spec.name, "state": state.value}
    response = Response(_json.encode(body), status=200 if ok else 503, content_type="application/json")
    if state is State.BACKOFF:
        response.headers["Retry-After"] = str(math.ceil(max(handle.backoff_until - trio.current_time(), 1.0)))
    return response
