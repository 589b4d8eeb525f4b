"""Bad input is always a 4xx with an OpenAI error body (never a 5xx, never a hang)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.backend.server.conftest import API_KEY, MODEL, TOOLS

USER = [{"role": "user", "content": "hi"}]


def _assert_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert {"type", "param", "code"} <= set(err)
    return err


@pytest.mark.parametrize(
    "body",
    [
        {"model": MODEL, "messages": USER, "n": 2},
        {"model": MODEL, "messages": USER, "temperature": 5},
        {"model": MODEL, "messages": USER, "top_p": 0},
        {"model": MODEL, "messages": USER, "max_tokens": 0},
        {"model": MODEL, "messages": []},
        {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        },
        {
            "model": MODEL,
            "messages": USER,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        {"model": MODEL, "messages": USER, "tool_choice": "required"},
        {"model": MODEL, "messages": USER, "logprobs": True},
        {"model": MODEL, "messages": USER, "stop": [""]},
        {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
        {
            "model": MODEL,
            "messages": USER,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
        },
        {"model": MODEL, "messages": [{"role": "user", "content": "word " * 2000}]},
    ],
)
def test_bad_chat_requests_are_400(server, body):
    resp = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    _assert_error(resp, 400)


def test_context_overflow_code(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 2000}]}
    err = _assert_error(httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60), 400)
    assert err["code"] == "context_length_exceeded"


def test_malformed_json_and_wrong_types(server):
    url = server.base_url + "/v1/chat/completions"
    resp = httpx.post(
        url, content=b'{"model": "tiny", "messages": [', headers={"content-type": "application/json"}
    )
    _assert_error(resp, 400)
    _assert_error(httpx.post(url, content=b"[1, 2]", headers={"content-type": "application/json"}), 400)
    _assert_error(httpx.post(server.base_url + "/v1/completions", json={"prompt": [1, 10**9]}), 400)
    _assert_error(
        httpx.post(server.base_url + "/v1/responses", json={"input": "x", "previous_response_id": "r"}), 400
    )


def test_unknown_route_and_method(server):
    _assert_error(httpx.get(server.base_url + "/v1/nothing"), 404)
    _assert_error(httpx.get(server.base_url + "/v1/chat/completions"), 405)


def test_openai_client_maps_errors(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=USER, n=2)
    assert "n > 1" in exc.value.message


def test_api_key_required(guarded_server):
    url = guarded_server.base_url
    _assert_error(httpx.get(url + "/v1/models"), 401)
    _assert_error(httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert httpx.get(url + "/health").status_code == 200  # liveness needs no key
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_oversize_body_is_413(guarded_server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 10_000}]}
    resp = httpx.post(guarded_server.base_url + "/v1/chat/completions", json=body, headers=headers)
    assert _assert_error(resp, 413)["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit holds on the bytes actually received
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    resp = httpx.post(
        guarded_server.base_url + "/v1/chat/completions",
        content=chunks(),
        headers={**headers, "content-type": "application/json"},
    )
    _assert_error(resp, 413)
