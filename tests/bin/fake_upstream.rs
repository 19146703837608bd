//! `fake-upstream --listen 127.0.0.1:9001 [--behavior vllm] [--tokens 8]`: the tests' fake
//! OpenAI-compatible server as a process, for the overhead benchmark (`bench/overhead`).

use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};

fn main() {
    let mut listen = "127.0.0.1:9001".to_owned();
    let mut behavior = Behavior::Vllm;
    let mut tokens = 8usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_default();
        match arg.as_str() {
            "--listen" => listen = value,
            "--tokens" => tokens = value.parse().unwrap_or(tokens),
            "--behavior" => {
                behavior = match value.as_str() {
                    "vllm" => Behavior::Vllm,
                    "openai" => Behavior::OpenAi,
                    "usage-in-finish" => Behavior::UsageInFinish,
                    "no-usage" => Behavior::NoUsage,
                    "calls-tool" => Behavior::CallsTool,
                    "paced" => Behavior::Paced,
                    "strict" => Behavior::Strict,
                    "reasons" => Behavior::Reasons,
                    "hang" => Behavior::Hang,
                    other => {
                        eprintln!(
                            "unknown behavior {other:?}: vllm, openai, usage-in-finish, no-usage, calls-tool, paced, hang"
                        );
                        std::process::exit(2);
                    }
                }
            }
            other => {
                eprintln!("unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    // One thread: the benchmark pins the upstreams and the gateway to one core.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .unwrap_or_else(|e| panic!("cannot listen on {listen}: {e}"));
        let _server = FakeUpstream::serve(listener, behavior, tokens);
        std::future::pending::<()>().await;
    });
}
