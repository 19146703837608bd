"""OpenAI's Responses API through Ringmaster with the official `openai` SDK: `responses.create`
(plain), `responses.stream` continuing it with `previous_response_id` on another replica of
the fleet (the stored response is in the fleet's Redis), `responses.retrieve` and
`input_items.list` from either replica, `delete`, and the errors in OpenAI's shape."""

import openai
import pytest

from gateway import SIMULATED_FLEET, redis, running

MODEL = "sim-llama-3-8b"


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="any", max_retries=0)


def test_a_conversation_continues_across_two_replicas():
    with redis() as cluster:
        args = ["--cluster", cluster]
        with running(SIMULATED_FLEET, args) as url_a, running(SIMULATED_FLEET, args) as url_b:
            a, b = client(url_a), client(url_b)
            first = a.responses.create(
                model=MODEL,
                input="What is the capital of France?",
                instructions="Answer briefly.",
                max_output_tokens=16,
                metadata={"run": "sdk"},
            )
            assert first.id.startswith("resp_")
            # The simulated servers write until max_output_tokens: the response says so.
            assert first.status in ("completed", "incomplete")
            if first.status == "incomplete":
                assert first.incomplete_details.reason == "max_output_tokens"
            assert first.output_text
            assert first.usage.input_tokens > 0
            assert first.metadata == {"run": "sdk"}

            # The follow-up lands on the other replica, streamed.
            with b.responses.stream(
                model=MODEL,
                input="And of Italy?",
                previous_response_id=first.id,
                max_output_tokens=16,
            ) as stream:
                events = list(stream)
            kinds = [event.type for event in events]
            # The last event carries the whole response (`response.incomplete` when the
            # simulated server wrote up to max_output_tokens, which the SDK's
            # get_final_response() does not take).
            second = events[-1].response
            assert kinds[:2] == ["response.created", "response.in_progress"], kinds
            assert "response.output_text.delta" in kinds
            assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
            assert second.previous_response_id == first.id
            assert second.output_text

            # Either replica finds either response.
            for replica in (a, b):
                assert replica.responses.retrieve(first.id).output_text == first.output_text
                assert replica.responses.retrieve(second.id).id == second.id
            items = b.responses.input_items.list(second.id, order="asc")
            assert [item.content[0].text for item in items.data] == ["And of Italy?"]

            b.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                a.responses.retrieve(first.id)
            with pytest.raises(openai.NotFoundError):
                a.responses.create(model=MODEL, input="x", previous_response_id=first.id)
