"""The official `openai` Python SDK as a real client of a started gateway's OpenAI door.

One gateway for the module: simulated servers, two tenants with keys, tiers, a model list and
limits, and an admission policy so that the fair queue is on the request path.
"""

import json

import openai
import pytest

from gateway import SIMULATED_FLEET, running

MODEL = "sim-llama-3-8b"
OTHER_MODEL = "sim-other"
KEY = "sk-openai-sdk-test"
LIMITED_KEY = "sk-openai-limited"
NARROW_KEY = "sk-openai-narrow"


@pytest.fixture(scope="module")
def gateway_url():
    config = f"""
models = ["{MODEL}", "{OTHER_MODEL}"]
[aliases]
"{OTHER_MODEL}" = "{MODEL}"
[[tenants]]
name = "acme"
input_tokens_per_minute = 1000000
[[tenants]]
name = "tiny"
requests_per_minute = 2
[[api_keys]]
key = "{KEY}"
tenant = "acme"
tier = "gold"
[[api_keys]]
key = "{LIMITED_KEY}"
tenant = "tiny"
[[api_keys]]
key = "{NARROW_KEY}"
models = ["{MODEL}"]
[policies.admission]
source = "builtin:tiered"
queue_priority = {{ gold = 2 }}
""" + SIMULATED_FLEET
    with running(config) as url:
        yield url


@pytest.fixture
def client(gateway_url):
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=KEY, max_retries=0)


def test_chat_completion(client):
    completion = client.chat.completions.create(
        model=MODEL,
        max_completion_tokens=16,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"},
        ],
    )
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage.prompt_tokens > 0
    assert 0 < completion.usage.completion_tokens <= 16
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_chat_completion_stream_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        max_tokens=24,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me a story"}]}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, roles = "", None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert roles == ["assistant"]
    assert text.strip()
    assert finish in ("stop", "length")
    assert usage is not None and 0 < usage.completion_tokens <= 24
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_legacy_completion_plain_and_streamed(client):
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8)
    assert completion.object == "text_completion"
    assert completion.choices[0].text
    assert completion.usage.completion_tokens <= 8
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=8, stream=True
        )
        if c.choices
    ]
    assert "".join(pieces)


def test_errors_have_openai_shape(client, gateway_url):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[])
    assert err.value.status_code == 400
    assert err.value.body["type"] == "invalid_request_error"
    assert "messages" in err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "hi"}])
    bad = openai.OpenAI(base_url=gateway_url + "/v1", api_key="sk-not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])


def test_simulated_servers_call_a_required_tool_plain_and_streamed(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"]}}}]
    ask = [{"role": "user", "content": "weather?"}]
    reply = client.chat.completions.create(
        model=MODEL, max_tokens=32, messages=ask, tools=tools, tool_choice="required"
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", reply
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "", "days": 0}
    # Streamed: the id and name first, the arguments in pieces.
    pieces, names = [], []
    for chunk in client.chat.completions.create(
        model=MODEL, max_tokens=32, messages=ask, tools=tools, tool_choice="required", stream=True
    ):
        for delta in (c.delta for c in chunk.choices):
            for piece in delta.tool_calls or []:
                function = piece.function
                names.append(function.name if function else None)
                pieces.append((function.arguments if function else None) or "")
    assert names[0] == "get_weather" and len(pieces) > 1, (names, pieces)
    assert json.loads("".join(pieces)) == {"city": "", "days": 0}
    # The model's own choice, after the result: text.
    answer = client.chat.completions.create(
        model=MODEL,
        max_tokens=16,
        tools=tools,
        messages=ask
        + [
            {"role": "assistant", "tool_calls": [call.model_dump(include={"id", "type", "function"})]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 C"},
        ],
    )
    assert answer.choices[0].finish_reason != "tool_calls" and answer.choices[0].message.content, answer


def test_a_key_limited_to_some_models_gets_403_for_others(gateway_url):
    narrow = openai.OpenAI(base_url=gateway_url + "/v1", api_key=NARROW_KEY, max_retries=0)
    narrow.chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    with pytest.raises(openai.PermissionDeniedError) as err:
        narrow.chat.completions.create(
            model=OTHER_MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert OTHER_MODEL in err.value.body["message"]


def test_rate_limits_answer_429_with_retry_after_and_headers(gateway_url, client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert int(raw.headers["anthropic-ratelimit-input-tokens-limit"]) == 1000000
    assert "x-ratelimit-remaining-tokens" in raw.headers
    limited = openai.OpenAI(base_url=gateway_url + "/v1", api_key=LIMITED_KEY, max_retries=0)
    for _ in range(2):
        limited.chat.completions.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.RateLimitError) as err:
        limited.chat.completions.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert err.value.status_code == 429
    assert int(err.value.response.headers["retry-after"]) >= 1
    assert err.value.body["code"] == "rate_limit_exceeded"


def test_models_list(client):
    assert {m.id for m in client.models.list()} == {MODEL, OTHER_MODEL}
