//! An OTLP receiver to export to in the tracing benchmark (`tests/bench/tracing.sh`): it
//! takes OTLP/HTTP and OTLP/gRPC on one port, decodes every batch, and answers
//! `GET /stats` with the spans received so far.

use std::convert::Infallible;

use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ringmaster_tests::otlp_receiver::OtlpReceiver;

#[derive(Parser)]
struct Args {
    /// Where the statistics are served (`GET /stats`).
    #[arg(long, default_value = "127.0.0.1:4319")]
    stats: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let receiver = std::sync::Arc::new(OtlpReceiver::counting().await);
    // Where the gateway exports to: printed for the script.
    #[allow(clippy::print_stdout)]
    {
        println!("{}", receiver.url());
    }
    let listener = tokio::net::TcpListener::bind(&args.stats).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let receiver = receiver.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_req| {
                let spans = receiver.received();
                async move {
                    Ok::<_, Infallible>(hyper::Response::new(
                        Full::new(bytes::Bytes::from(format!("{{\"spans\": {spans}}}"))).boxed(),
                    ))
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
