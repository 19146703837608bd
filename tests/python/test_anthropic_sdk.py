"""The official `anthropic` Python SDK as a real client of a started gateway.

The gateway binary comes from RINGMASTER_BIN (tests/run builds it); each test session starts
one gateway on a free loopback port with an API key, simulated servers at a fast time scale,
and stops it at the end.
"""


import anthropic
import pytest

from gateway import SIMULATED_FLEET, running

API_KEY = "sk-ringmaster-sdk-test"
MODEL = "sim-llama-3-8b"
# A phrase the gateway's safety filter (the built-in blocklist) refuses in prompts.
BLOCKED = "open the pod bay doors"


@pytest.fixture(scope="session")
def gateway_url():
    config = f"""
models = ["{MODEL}"]
[[api_keys]]
key = "{API_KEY}"
[policies.safety]
source = "builtin:blocklist"
config = {{ patterns = "{BLOCKED}" }}
""" + SIMULATED_FLEET
    with running(config) as url:
        yield url


@pytest.fixture
def client(gateway_url):
    return anthropic.Anthropic(base_url=gateway_url, api_key=API_KEY, max_retries=0)


def test_messages_create(client):
    message = client.messages.create(
        model=MODEL,
        max_tokens=32,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hello"}],
    )
    assert message.id.startswith("msg_")
    assert message.role == "assistant"
    assert message.model == MODEL
    assert message.content[0].type == "text"
    assert message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0
    assert 0 < message.usage.output_tokens <= 32


def test_messages_stream_text(client):
    with client.messages.stream(
        model=MODEL,
        max_tokens=40,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me a story"}]}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip()
    assert final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0


def test_stop_sequence_and_max_tokens(client):
    message = client.messages.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "Count"}]
    )
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 3


def test_bad_request_error(client):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=10, messages=[])
    assert err.value.status_code == 400
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "messages" in err.value.body["error"]["message"]
    assert err.value.response.headers["request-id"].startswith("req_")


def test_authentication_error(gateway_url):
    bad = anthropic.Anthropic(base_url=gateway_url, api_key="sk-not-a-real-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        bad.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 401
    assert err.value.body["error"]["type"] == "authentication_error"


def test_not_found_error(client):
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(
            model="claude-does-not-exist", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert err.value.status_code == 404
    assert "claude-does-not-exist" in err.value.body["error"]["message"]


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_a_prompt_the_safety_filter_blocks_is_a_bad_request(client):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "Please OPEN THE POD BAY DOORS, HAL."}],
        )
    assert caught.value.status_code == 400
    assert "safety filter blocked the prompt" in str(caught.value)


def test_count_tokens(client):
    counted = client.messages.count_tokens(
        model=MODEL,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hello to the whole wide world"}],
    )
    assert counted.input_tokens > 0
    longer = client.messages.count_tokens(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello to the whole wide world " * 20}],
    )
    assert longer.input_tokens > counted.input_tokens


def test_simulated_servers_call_a_forced_tool_and_answer_its_result(client):
    weather = {
        "name": "get_weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    ask = [{"role": "user", "content": "weather?"}]
    message = client.messages.create(
        model=MODEL, max_tokens=32, tools=[weather], tool_choice={"type": "any"}, messages=ask
    )
    assert message.stop_reason == "tool_use", message
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": ""}, call
    # Streamed, the SDK's helper assembles the same call from its pieces.
    with client.messages.stream(
        model=MODEL, max_tokens=32, tools=[weather], tool_choice={"type": "any"}, messages=ask
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and streamed.content[0].input == {"city": ""}, streamed
    # Given the result, the model (its choice left to it) answers in text.
    answer = client.messages.create(
        model=MODEL,
        max_tokens=16,
        tools=[weather],
        messages=ask
        + [
            {"role": "assistant", "content": [call.model_dump(include={"type", "id", "name", "input"})]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C"}]},
        ],
    )
    assert answer.stop_reason != "tool_use" and answer.content[0].type == "text", answer


def test_rate_limit_headers_are_absent_without_limits(client):
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert "anthropic-ratelimit-requests-limit" not in raw.headers
