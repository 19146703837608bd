"""Tool use through both official SDKs: a started gateway in front of an OpenAI-compatible
server that calls tools the way vLLM streams them (the tests' fake upstream, `calls-tool`).

The Anthropic SDK's `tools`, `tool_use` blocks (plain, and streamed as `input_json_delta`
pieces its stream helper assembles) and `tool_result` turns; the OpenAI SDK's `tools`,
`tool_calls` (plain and streamed) and `tool` messages.
"""

import json

import anthropic
import openai
import pytest

from gateway import fake_upstream, running

KEY = "sk-tools-test"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def gateway_url():
    with fake_upstream("calls-tool") as upstream:
        config = f"""
models = ["fake"]
[[api_keys]]
key = "{KEY}"
[[servers]]
address = "{upstream}"
"""
        with running(config) as url:
            yield url


@pytest.fixture
def claude(gateway_url):
    return anthropic.Anthropic(base_url=gateway_url, api_key=KEY, max_retries=0)


@pytest.fixture
def oai(gateway_url):
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=KEY, max_retries=0)


def test_anthropic_tool_use_plain(claude):
    message = claude.messages.create(
        model="fake",
        max_tokens=64,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert message.stop_reason == "tool_use"
    [call] = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "get_weather"
    assert call.input == {"city": "Paris"}

    # The next turn carries the call and its result; the server answers it.
    follow_up = claude.messages.create(
        model="fake",
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [b.model_dump() for b in message.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C"}],
            },
        ],
    )
    assert follow_up.stop_reason == "tool_use"


def test_anthropic_tool_use_streamed(claude):
    with claude.messages.stream(
        model="fake",
        max_tokens=64,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert "input_json" in kinds, kinds
    assert message.stop_reason == "tool_use"
    [call] = [b for b in message.content if b.type == "tool_use"]
    assert (call.id, call.name, call.input) == ("call_fake_1", "get_weather", {"city": "Paris"})


def test_openai_tool_calls_plain_and_streamed(oai):
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object"}},
        }
    ]
    completion = oai.chat.completions.create(
        model="fake",
        tools=tools,
        tool_choice="required",
        messages=[{"role": "user", "content": "Find Paris"}],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "lookup"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    arguments, names = "", []
    finish = None
    for chunk in oai.chat.completions.create(
        model="fake",
        tools=tools,
        stream=True,
        messages=[{"role": "user", "content": "Find Paris"}],
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for piece in delta.tool_calls or []:
            assert piece.index == 0
            if piece.function.name:
                names.append(piece.function.name)
            arguments += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["lookup"]
    assert json.loads(arguments) == {"city": "Paris"}
    assert finish == "tool_calls"

    # A tool message answering the call is taken as the next turn.
    again = oai.chat.completions.create(
        model="fake",
        tools=tools,
        messages=[
            {"role": "user", "content": "Find Paris"},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "48.86N 2.35E"},
        ],
    )
    assert again.choices[0].finish_reason == "tool_calls"
