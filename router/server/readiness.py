"""`GET /health?model=NAME`: whether one model can serve, for a balancer or a readiness probe.

`/health` alone says the server answers (llama-server's meaning). A balancer in front of
several Corral hosts needs more: whether *this* host can serve *this* model now. It
answers 200 while the model is loaded, or not loaded but loadable (Corral loads on the
first request, so an unloaded model is ready to serve: a balancer that took such hosts out
would never send the request that loads them). It answers 503 while a request would wait
or fail: the model is loading (`starting`, as llama-server answers 503 while it loads, so
that a pod with `preload = true` takes traffic only once loaded), its start is waiting to
be tried again (`backoff`, with Retry-After), or its last start failed for good (`failed`).
A model it does not serve is 404, naming `model`; an alias answers for its model.
`unknown_model = "default"` does not apply: a probe that names a model asks about that
model.
"""

from __future__ import annotations

import math

import msgspec
import trio
from quart import Response

from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor, unknown_model

_json = msgspec.json.Encoder()

# The states in which a request to the model would wait for a load, or fail.
UNAVAILABLE = frozenset({State.STARTING, State.FAILED, State.BACKOFF})


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
