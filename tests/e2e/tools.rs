//! Tool use and images over real sockets: Anthropic's `tools`, `tool_use` and `tool_result`
//! and OpenAI's `tools`, `tool_calls` and `tool` messages, translated to and from an
//! OpenAI-compatible server that calls tools the way vLLM streams them; image blocks and
//! `image_url` parts as OpenAI content parts; simulated servers calling tools as a model
//! would, through every door; and the 400 naming the feature for a pool whose servers cannot
//! call tools (`model.rs`: a model's) or read images.

use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
use serde_json::{Value, json};

use crate::support::{TestGateway, sse_events};

async fn gateway_for(server: &FakeUpstream) -> TestGateway {
    TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\n",
        server.url()
    ))
    .await
}

fn weather_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    })
}

fn ask_weather(stream: bool) -> Value {
    json!({
        "model": "fake",
        "max_tokens": 64,
        "stream": stream,
        "tools": [weather_tool()],
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    })
}

#[tokio::test]
async fn a_tool_call_comes_back_as_a_tool_use_block_plain_and_streamed() {
    let server = FakeUpstream::start(Behavior::CallsTool, 3).await;
    let gw = gateway_for(&server).await;

    let reply = gw.post_messages(&ask_weather(false)).await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["stop_reason"], "tool_use", "{body}");
    assert_eq!(
        body["content"],
        json!([{"type": "tool_use", "id": "call_fake_1", "name": "get_weather",
                "input": {"city": "Paris"}}]),
        "{body}"
    );
    // The server was offered the tool in OpenAI's terms.
    let sent = server.last_request_json();
    assert_eq!(
        sent["tools"],
        json!([{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    );
    assert_eq!(sent["tool_choice"], "required");

    let reply = gw.post_messages(&ask_weather(true)).await;
    assert_eq!(reply.status(), 200);
    let events = sse_events(&reply.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    // The stream's blocks are the plain reply's: a tool_use block first, no empty text
    // block before it.
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{events:?}"
    );
    let (_, start) = &events[2];
    assert_eq!(start["index"], 0);
    assert_eq!(
        start["content_block"],
        json!({"type": "tool_use", "id": "call_fake_1", "name": "get_weather", "input": {}})
    );
    let input: String = events
        .iter()
        .filter(|(name, _)| name == "content_block_delta")
        .map(|(_, e)| {
            assert_eq!(e["index"], 0);
            assert_eq!(e["delta"]["type"], "input_json_delta");
            e["delta"]["partial_json"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(events[6].1["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn a_tool_result_goes_to_the_server_as_a_tool_message_after_the_call() {
    let server = FakeUpstream::start(Behavior::Vllm, 2).await;
    let gw = gateway_for(&server).await;
    let reply = gw
        .post_messages(&json!({
            "model": "fake",
            "max_tokens": 64,
            "tools": [weather_tool()],
            "messages": [
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "18 C, sunny"}]},
                    {"type": "text", "text": "And tomorrow?"}]},
            ],
        }))
        .await;
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
    let sent = server.last_request_json();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "{sent}");
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(messages[1]["content"], "Let me look.");
    assert_eq!(
        messages[1]["tool_calls"],
        json!([{"id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}])
    );
    assert_eq!(
        messages[2],
        json!({"role": "tool", "content": "18 C, sunny", "tool_call_id": "toolu_1"})
    );
    assert_eq!(
        messages[3],
        json!({"role": "user", "content": "And tomorrow?"})
    );
    // The client named no tool_choice: the server is told none either.
    assert!(sent.get("tool_choice").is_none(), "{sent}");
}

#[tokio::test]
async fn tool_calls_through_the_openai_api_plain_and_streamed() {
    let server = FakeUpstream::start(Behavior::CallsTool, 3).await;
    let gw = gateway_for(&server).await;
    let ask = |stream: bool| {
        json!({
            "model": "fake",
            "stream": stream,
            "tools": [{"type": "function", "function": {
                "name": "lookup", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            "parallel_tool_calls": false,
            "messages": [{"role": "user", "content": "Find Paris"}],
        })
    };
    let reply = gw.post_chat(&ask(false)).await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["id"], "call_fake_1");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "lookup");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    let sent = server.last_request_json();
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "function", "function": {"name": "lookup"}})
    );
    assert_eq!(sent["parallel_tool_calls"], false);

    let reply = gw.post_chat(&ask(true)).await;
    let text = reply.text().await.unwrap();
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let pieces: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(pieces.len(), 3, "{text}");
    assert_eq!(pieces[0]["id"], "call_fake_1");
    assert_eq!(pieces[0]["function"]["name"], "lookup");
    assert!(pieces.iter().all(|p| p["index"] == 0));
    let arguments: String = pieces
        .iter()
        .map(|p| p["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"city": "Paris"})
    );
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));

    // The next turn: the call and its result, in OpenAI's terms, reach the server as sent.
    let reply = gw
        .post_chat(&json!({
            "model": "fake",
            "tools": [{"type": "function", "function": {"name": "lookup"}}],
            "messages": [
                {"role": "user", "content": "Find Paris"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_9", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_9", "content": "48.86N 2.35E"},
            ],
        }))
        .await;
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
    let sent = server.last_request_json();
    assert_eq!(
        sent["messages"][1]["tool_calls"][0]["function"]["arguments"],
        "{\"q\":\"Paris\"}"
    );
    assert_eq!(
        sent["messages"][2],
        json!({"role": "tool", "content": "48.86N 2.35E", "tool_call_id": "call_9"})
    );
}

/// A tool whose schema requires an argument: the simulated call must fill it.
fn city_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                         "days": {"type": "integer", "minimum": 1}},
                         "required": ["city", "days"]},
    })
}

#[tokio::test]
async fn simulated_servers_call_a_forced_tool_through_every_door_and_answer_its_result() {
    let gw = TestGateway::simulated(1, 0.01, "").await;
    let arguments = json!({"city": "", "days": 1});
    let mut ask = ask_weather(false);
    ask["model"] = json!("sim-llama-3-8b");
    ask["tools"] = json!([city_tool()]);
    let reply = gw.post_messages(&ask).await;
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["stop_reason"], "tool_use", "{body}");
    let call = &body["content"][0];
    assert_eq!(
        (&call["type"], &call["name"], &call["input"]),
        (&json!("tool_use"), &json!("get_weather"), &arguments),
        "{body}"
    );

    // Streamed: a tool_use block whose input arrives in pieces.
    ask["stream"] = json!(true);
    let reply = gw.post_messages(&ask).await;
    assert_eq!(reply.status(), 200);
    let events = sse_events(&reply.text().await.unwrap());
    let input: String = events
        .iter()
        .filter(|(name, e)| {
            name == "content_block_delta" && e["delta"]["type"] == "input_json_delta"
        })
        .map(|(_, e)| e["delta"]["partial_json"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&input).unwrap(), arguments);
    assert!(
        events
            .iter()
            .any(|(name, e)| name == "message_delta" && e["delta"]["stop_reason"] == "tool_use"),
        "{events:?}"
    );

    // Auto, with the tool's result: the model reports in text.
    let tool_use_id = call["id"].as_str().unwrap();
    let reply = gw
        .post_messages(&json!({
            "model": "sim-llama-3-8b",
            "max_tokens": 32,
            "tools": [city_tool()],
            "messages": [
                {"role": "user", "content": "Call get_weather for Paris."},
                {"role": "assistant", "content": [call]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": tool_use_id, "content": "18 C"}]},
            ],
        }))
        .await;
    let body: Value = reply.json().await.unwrap();
    assert_ne!(body["stop_reason"], "tool_use", "{body}");
    assert_eq!(body["content"][0]["type"], "text", "{body}");

    // OpenAI's chat: `tool_calls`, the named function forced.
    let reply = gw
        .post_chat(&json!({
            "model": "sim-llama-3-8b",
            "max_tokens": 32,
            "tools": [{"type": "function", "function": {
                "name": "get_weather", "parameters": city_tool()["input_schema"]}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "messages": [{"role": "user", "content": "Weather?"}],
        }))
        .await;
    let body: Value = reply.json().await.unwrap();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let function = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(function["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(function["arguments"].as_str().unwrap()).unwrap(),
        arguments
    );

    // The Responses API: a function_call item, the tool named in the user's words (auto).
    let reply = gw
        .client
        .post(gw.url("/v1/responses"))
        .json(&json!({
            "model": "sim-llama-3-8b",
            "max_output_tokens": 32,
            "tools": [{"type": "function", "name": "get_weather",
                       "parameters": city_tool()["input_schema"]}],
            "input": "Use get_weather, please.",
        }))
        .send()
        .await
        .unwrap();
    let body: Value = reply.json().await.unwrap();
    let item = body["output"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["type"] == "function_call"))
        .unwrap_or_else(|| panic!("a function_call item: {body}"));
    assert_eq!(item["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(item["arguments"].as_str().unwrap()).unwrap(),
        arguments
    );
}

#[tokio::test]
async fn images_reach_the_server_as_image_url_parts_and_are_refused_for_in_process_pools() {
    let server = FakeUpstream::start(Behavior::Vllm, 2).await;
    let gw = gateway_for(&server).await;
    let reply = gw
        .post_messages(&json!({
            "model": "fake",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "iVBORw0KGgo="}},
                {"type": "text", "text": "What is this?"}]}],
        }))
        .await;
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
    assert_eq!(
        server.last_request_json()["messages"][0]["content"],
        json!([
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "text", "text": "What is this?"}
        ])
    );
    // The OpenAI door relays its body to an OpenAI server as the client wrote it.
    let reply = gw
        .post_chat(&json!({
            "model": "fake",
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "And this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]}],
        }))
        .await;
    assert_eq!(reply.status(), 200);
    assert_eq!(
        server.last_request_json()["messages"][0]["content"][1],
        json!({"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}})
    );

    let local = TestGateway::simulated(1, 0.01, "").await;
    let reply = local
        .post_messages(&json!({
            "model": "sim-llama-3-8b",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {"type": "text", "text": "What is this?"}]}],
        }))
        .await;
    assert_eq!(reply.status(), 400);
    let body: Value = reply.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("image input is not supported"),
        "{message}"
    );
}

#[tokio::test]
async fn count_tokens_counts_tools_and_images_and_refuses_them_where_they_cannot_be_served() {
    let server = FakeUpstream::start(Behavior::Vllm, 2).await;
    let gw = gateway_for(&server).await;
    let count = |body: Value| {
        let gw = &gw;
        async move {
            let reply = gw
                .client
                .post(gw.url("/v1/messages/count_tokens"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(reply.status(), 200);
            assert_eq!(reply.headers()["x-ringmaster-token-count"], "estimated");
            reply.json::<Value>().await.unwrap()["input_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    let question = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let bare = count(json!({"model": "fake", "messages": question})).await;
    let with_tools =
        count(json!({"model": "fake", "messages": question, "tools": [weather_tool()]})).await;
    let spec = weather_tool();
    let spec_bytes = "get_weather".len()
        + "The weather in a city".len()
        + spec["input_schema"].to_string().len();
    assert!(
        with_tools >= bare + (spec_bytes as u64) / 4,
        "the tools offered are counted: {bare} → {with_tools}"
    );
    let with_image = count(
        json!({"model": "fake", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "What is the weather in Paris?"}]}]}),
    )
    .await;
    assert_eq!(with_image, bare + 1_600, "an image is counted at its bound");

    // A pool of Ringmaster's own engines counts exactly, so it refuses what it cannot serve:
    // simulated servers take tools, but read no images.
    let local = TestGateway::simulated(1, 0.01, "").await;
    let count_local = |body: Value| {
        let local = &local;
        async move {
            local
                .client
                .post(local.url("/v1/messages/count_tokens"))
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let reply = count_local(
        json!({"model": "sim-llama-3-8b", "messages": question, "tools": [weather_tool()]}),
    )
    .await;
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["x-ringmaster-token-count"], "exact");
    let reply = count_local(json!({"model": "sim-llama-3-8b", "messages": [{"role": "user",
        "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                    {"type": "text", "text": "What is this?"}]}]}))
    .await;
    assert_eq!(reply.status(), 400);
    let body: Value = reply.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("image input"), "{message}");
}

#[tokio::test]
async fn the_output_filter_reads_tool_call_arguments() {
    let server = FakeUpstream::start(Behavior::CallsTool, 2).await;
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\n\
         [policies.safety]\nsource = \"builtin:blocklist\"\nconfig = {{ patterns = \"paris\" }}\n",
        server.url()
    ))
    .await;
    let mut ask = ask_weather(true);
    ask["messages"][0]["content"] = json!("What is the weather in the capital of France?");
    let reply = gw.post_messages(&ask).await;
    assert_eq!(reply.status(), 200);
    let text = reply.text().await.unwrap();
    assert!(
        !text.contains("Paris"),
        "blocked arguments reached the client: {text}"
    );
    let events = sse_events(&text);
    let delta = events.iter().find(|(e, _)| e == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "refusal", "{text}");

    ask["stream"] = json!(false);
    let reply = gw.post_messages(&ask).await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["stop_reason"], "refusal", "{body}");
    assert!(
        body["content"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] != "tool_use"),
        "a refused reply's calls are left out: {body}"
    );
}
