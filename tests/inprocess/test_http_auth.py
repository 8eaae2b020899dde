"""The HTTP front's API key and its JSON-only bodies: a missing or wrong key gets 401 in
OpenAI's format on every route but /health (routes added later included), the official
`openai` client sees `AuthenticationError` and works with the right key, and a body that is
not `application/json` gets 415 before it is read."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest
from aiohttp import web
from http_helpers import REQUEST_TIMEOUT_S, HttpResult, http_json

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.engine_backend import EngineBackend

MODEL = "tiny"
KEY = "sk-minipd-test-key"
BODY = b'{"prompt": "ok", "max_tokens": 2}'


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(model=MODEL, num_blocks=32, max_model_len=256)


def _serve(loop_thread, app: web.Application):
    runner, port = loop_thread.run(start_http_server(app, "127.0.0.1", 0))
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def guarded(engine, loop_thread):
    """An app with an API key, plus a route added after it was built (as an admin call would be)."""
    app = build_app(EngineBackend(engine, MODEL), HttpConfig(api_key=KEY))

    async def admin(request: web.Request) -> web.Response:
        return web.json_response({"switched": True})

    app.router.add_post("/admin/role", admin)
    runner, url = _serve(loop_thread, app)
    yield url
    loop_thread.run(runner.cleanup())


@pytest.fixture(scope="module")
def open_api(engine, loop_thread):
    runner, url = _serve(loop_thread, build_app(EngineBackend(engine, MODEL), HttpConfig()))
    yield url
    loop_thread.run(runner.cleanup())


def _call(method: str, url: str, headers: dict[str, str], body: bytes | None = None) -> HttpResult:
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            raw = response.read()
            return HttpResult(
                response.status,
                dict(response.headers),
                json.loads(raw) if response.headers.get_content_type() == "application/json" else {},
            )
    except urllib.error.HTTPError as error:
        return HttpResult(error.code, dict(error.headers), json.loads(error.read()))


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/v1/completions", BODY),
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'),
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
        ("POST", "/admin/role", b"{}"),
        ("GET", "/no/such/route", None),
    ],
)
@pytest.mark.parametrize(
    "authorization, code",
    [
        (None, None),
        ("Bearer wrong-key", "invalid_api_key"),
        (f"Basic {KEY}", "invalid_api_key"),
        (f"Bearer {KEY}x", "invalid_api_key"),
    ],
    ids=["missing", "wrong", "not-bearer", "longer"],
)
def test_a_missing_or_wrong_key_gets_401_in_openai_format(guarded, method, path, body, authorization, code):
    headers = dict(JSON, **({"Authorization": authorization} if authorization else {}))
    result = _call(method, guarded + path, headers, body)
    assert result.status == 401 and result.headers.get("WWW-Authenticate") == "Bearer"
    error = result.body["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code and error["param"] is None
    assert ("API key" in error["message"] or "API_KEY" in error["message"]) and KEY not in error["message"]


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/v1/completions", BODY),
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
        ("POST", "/admin/role", b"{}"),
    ],
)
def test_the_right_key_is_served(guarded, method, path, body):
    result = _call(method, guarded + path, dict(JSON, Authorization=f"Bearer {KEY}"), body)
    assert result.status == 200, result


def test_health_stays_open(guarded):
    assert http_json("GET", f"{guarded}/health").status == 200


def test_the_openai_client_sees_authentication_errors_and_works_with_the_key(guarded):
    wrong = openai.OpenAI(base_url=f"{guarded}/v1", api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.completions.create(model=MODEL, prompt="ok", max_tokens=2)
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    right = openai.OpenAI(base_url=f"{guarded}/v1", api_key=KEY, max_retries=0, timeout=30)
    completion = right.completions.create(model=MODEL, prompt="ok", max_tokens=2, temperature=0)
    assert completion.usage.completion_tokens == 2


def test_without_a_key_the_api_is_open(open_api):
    assert _call("POST", f"{open_api}/v1/completions", JSON, BODY).status == 200


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "text/json",
    ],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_that_is_not_json_typed_gets_415(open_api, path, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    result = _call("POST", open_api + path, headers, BODY)
    assert result.status == 415
    error = result.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "Content-Type"
    assert error["code"] == "unsupported_media_type" and "expected application/json" in error["message"]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
def test_json_with_parameters_or_any_case_is_accepted(open_api, content_type):
    assert _call("POST", f"{open_api}/v1/completions", {"Content-Type": content_type}, BODY).status == 200


def test_the_key_is_checked_before_the_content_type(guarded):
    result = _call("POST", f"{guarded}/v1/completions", {"Content-Type": "text/plain"}, BODY)
    assert result.status == 401


def test_an_empty_key_is_refused():
    with pytest.raises(ValueError, match="api_key"):
        HttpConfig(api_key=" ").validate()
