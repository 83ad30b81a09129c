"""router/api/responses/errors.py: OpenAI's error shape with the Responses API's codes."""

from __future__ import annotations

import json

from router.api.responses.errors import PreviousNotFound, ResponseNotFound, render
from supervisor.errors import ModelNotFound, Overloaded


def test_a_missing_predecessor_is_openais_previous_response_not_found() -> None:
    body, status, headers = render(PreviousNotFound("Previous response with id 'resp_x' not found.", "previous_response_id"))
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": {
        "message": "Previous response with id 'resp_x' not found.", "type": "invalid_request_error",
        "param": "previous_response_id", "code": "previous_response_not_found",
    }}
    body, status, _ = render(ResponseNotFound("Response with id 'resp_x' not found.", "response_id"))
    assert status == 404 and json.loads(body)["error"]["type"] == "invalid_request_error"


def test_the_rest_is_openais_shape_with_the_shared_statuses() -> None:
    body, status, headers = render(Overloaded("Too many requests.", 3.0))
    assert status == 429 and json.loads(body)["error"]["type"] == "rate_limit_error" and headers["retry-after"] == "3"
    body, status, _ = render(ModelNotFound("The model `x` does not exist.", "model"))
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
