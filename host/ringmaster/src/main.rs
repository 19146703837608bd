//! `ringmaster`: the gateway binary. Parses the command line, loads and validates the
//! configuration (embedded default, then `--config`, then flags), sets up logging, and runs the
//! gateway until SIGINT or SIGTERM (then drains; a second signal stops at once); or, as
//! `ringmaster worker`, serves one model engine over HTTP. All logic lives in
//! `ringmaster-gateway` and `ringmaster-worker`.

use std::path::PathBuf;

mod policy_cmd;

/// The gateway allocates and frees a few dozen small buffers per request (headers, JSON,
/// bodies) across tasks; mimalloc's per-thread free lists do that for a fraction of glibc's
/// cost (paired runs in BENCHMARKS.md, "Latest run").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use ringmaster_config::{DEFAULT_CONFIG_TOML, RawConfig};
use ringmaster_gateway::Gateway;
use tokio::net::TcpListener;
use tracing::info;

/// Ringmaster: a cache-aware LLM request router.
#[derive(Debug, Parser)]
#[command(name = "ringmaster", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "RINGMASTER_LOG_FORMAT"
    )]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (with no arguments: 4 simulated GPU servers on 127.0.0.1:8080).
    Serve(ServeArgs),
    /// Validate a configuration file and print what it resolves to.
    CheckConfig {
        /// The TOML file.
        config: PathBuf,
        /// Also connect to each remote server (an `https://` one with the TLS handshake a
        /// request makes: its CA file, its name, a client certificate) and say per server
        /// whether it works, or why not; exits 1 when one does not.
        #[arg(long)]
        probe: bool,
    },
    /// Print the embedded default configuration, a starting point for your own.
    DefaultConfig,
    /// Print an API key's SHA-256, for `key_sha256` in `[[api_keys]]` (the config then holds
    /// no secret). Reads the key from standard input, so that it stays out of shell history.
    KeyHash,
    /// Serve one model engine over HTTP (OpenAI-compatible API, load, KV events).
    Worker(WorkerArgs),
    /// Benchmarks that run in process.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Write, build, check, test and push policies (in Rust, Python, JavaScript or C).
    #[command(subcommand)]
    Policy(policy_cmd::PolicyCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Replay a trace through the routing code on the modelled clock, once per router, and
    /// report hit ratios, TTFT, load balance and the gap to the cache oracles.
    Replay(ReplayArgs),
}

#[derive(Debug, clap::Args)]
struct ReplayArgs {
    /// The scenario file (TOML: trace, servers, kv_blocks, routers; see
    /// `host/replay/scenarios/`).
    scenarios: Vec<PathBuf>,
    /// Where the JSON and Markdown results go.
    #[arg(long, default_value = "target/replay")]
    out: PathBuf,
    /// Regenerate this file's routing section (between its `replay` markers) from the
    /// results.
    #[arg(long)]
    benchmarks: Option<PathBuf>,
    /// With --benchmarks: regenerate the section between the `replay-NAME` markers instead
    /// (appended when the file has none yet).
    #[arg(long, requires = "benchmarks")]
    section: Option<String>,
}

#[derive(Debug, clap::Args)]
struct WorkerArgs {
    /// The llama GGUF model (default: the model `cargo xtask model` fetched).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: String,
    /// The model name clients use (default: the file name, lowercased, without `.gguf` and
    /// its quantization suffix).
    #[arg(long)]
    name: Option<String>,
    /// Kernel threads.
    #[arg(long, env = "RINGMASTER_MODEL_THREADS", default_value_t = 1)]
    threads: usize,
    /// Kernel instruction set: auto, avx2, avx or scalar.
    #[arg(long, default_value = "auto")]
    kernels: String,
    /// KV-cache blocks of 16 tokens (default: 2048 on the CPU; on a GPU, 90% of the memory
    /// free after the weights).
    #[arg(long)]
    kv_blocks: Option<u32>,
    /// Where the model runs: `cpu`, or `cuda` / `cuda:N` for GPU N (a build with the `cuda`
    /// feature).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 16)]
    max_running: u32,
    /// Most tokens computed per engine step [default: 512 on the CPU; on a GPU 2,048, with
    /// prefill allowed all the decodes leave].
    #[arg(long)]
    step_token_budget: Option<u32>,
    /// Serve the simulated engine (the cost model of one H100 serving a Llama-3-8B-class
    /// model; no weights, no model file) under `--name` (default `sim`): a fleet of workers
    /// that gateway replicas share, with its KV events, for tests and benchmarks.
    #[arg(long, conflicts_with_all = ["model", "device"])]
    simulated: bool,
    /// With --simulated: the time scale (1.0 real time, 0.1 ten times faster).
    #[arg(long, default_value_t = 1.0, requires = "simulated")]
    time_scale: f64,
    /// Its part in a disaggregated fleet: `both` (whole requests and either leg), `prefill`
    /// (computes prompts and keeps their KV blocks for a decode worker) or `decode` (decodes
    /// from a prefill worker's blocks). Whole requests are served in every role.
    #[arg(long, default_value = "both", value_parser = ["both", "prefill", "decode"])]
    role: String,
    /// The environment variable that holds the secret this worker shares with its gateways
    /// (their `[workers] secret_env`): a split request's legs, and fetches of the KV blocks a
    /// prefill kept, must carry its credential, else they are served whole (or refused).
    /// Needed with --role prefill or decode; without it, a `both` worker serves whole
    /// requests only.
    #[arg(long, default_value = ringmaster_tls::credential::DEFAULT_SECRET_ENV)]
    secret_env: String,
    /// A prefill worker this worker may fetch KV blocks from, as the gateway reaches it
    /// (HOST:PORT, as in the gateway's `[[servers]]` url); repeat it, or separate by commas.
    /// Needed with --role decode: a decode leg naming any other address is served whole.
    #[arg(long = "kv-peer", value_delimiter = ',')]
    kv_peers: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// TOML configuration file; without it, the embedded default.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides the file).
    #[arg(long)]
    listen: Option<String>,
    /// The router policy: `builtin:NAME` (prefix-affinity, consistent-hash, cache-aware,
    /// round-robin, …) or a component file (overrides the file's routers).
    #[arg(long)]
    router: Option<String>,
    /// Simulated servers' time scale: 1.0 real time, 0.01 a hundred times faster.
    #[arg(long)]
    sim_time_scale: Option<f64>,
    /// Serve this llama GGUF model on the CPU (one server) instead of the configured ones.
    /// Without --config and --model, the model `cargo xtask model` fetched is used when it is
    /// there, else simulated servers.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Serve simulated servers even when a model is in the model cache.
    #[arg(long, conflicts_with = "model")]
    simulated: bool,
    /// Kernel threads per model server (overrides `[model] threads`; default 1).
    #[arg(long, env = "RINGMASTER_MODEL_THREADS")]
    threads: Option<usize>,
    /// Join other gateway replicas on this Redis (`redis://HOST:PORT/DB` or
    /// `redis+unix:///path`; overrides `[cluster] url`): membership, policies, limits, load
    /// and experiment figures are then the fleet's.
    #[arg(long, env = "RINGMASTER_CLUSTER")]
    cluster: Option<String>,
    /// This replica's name in the cluster (overrides `[cluster] name`; default: host:port).
    #[arg(long, env = "RINGMASTER_REPLICA")]
    replica: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // `serve` sets up its logs itself, after its configuration says where traces go.
    if !matches!(cli.command, Command::Serve(_)) {
        init_logging(cli.log_format, None)?;
    }
    match cli.command {
        Command::Serve(args) => serve(args, cli.log_format),
        Command::Bench(BenchCommand::Replay(args)) => bench_replay(args),
        Command::Policy(command) => policy_cmd::run(command),
        Command::CheckConfig { config, probe } => {
            let resolved = RawConfig::from_file(&config)?.validate()?;
            // What only the engines can check (this CPU's kernels, the simulator's numbers
            // together, the ring's bounds), as `serve` would apply it.
            ringmaster_gateway::pool::settings::ring_config(&resolved.ring)?;
            ringmaster_gateway::pool::ServerTemplates::from_config(&resolved)?;
            // A component file that is missing or of the wrong world would stop `serve`:
            // load each one now, as `serve` would, and say what it is.
            let components = policy_cmd::check_config_components(&resolved.policies)?;
            Gateway::check_tls(&resolved)?;
            // Written at once, and a reader that stops early (`| head`) is no error.
            let mut out = String::new();
            {
                use std::fmt::Write as _;
                let _ = writeln!(out, "{} is valid:", config.display());
                let _ = writeln!(
                    out,
                    "  listen     {}{}",
                    resolved.listen,
                    tls_line(resolved.tls.as_ref())
                );
                if let Some(admin) = &resolved.admin_listener {
                    let _ = writeln!(
                        out,
                        "  admin at   {}{}",
                        admin.listen,
                        tls_line(admin.tls.as_ref())
                    );
                }
                let _ = writeln!(out, "  models     {}", models_line(&resolved));
                for variant in &resolved.policies.router {
                    let _ = writeln!(
                        out,
                        "  router     {} = {}{}{}",
                        variant.name,
                        variant.source,
                        components
                            .get(&variant.source.to_string())
                            .map(|c| format!(" ({c})"))
                            .unwrap_or_default(),
                        if variant.shadow { " (shadow)" } else { "" }
                    );
                }
                for (slot, spec) in [
                    ("admission", &resolved.policies.admission),
                    ("safety", &resolved.policies.safety),
                ] {
                    if let Some(spec) = spec {
                        let _ = writeln!(
                            out,
                            "  {slot:<10} {} = {}{}",
                            spec.name,
                            spec.source,
                            components
                                .get(&spec.source.to_string())
                                .map(|c| format!(" ({c})"))
                                .unwrap_or_default()
                        );
                    }
                }
                for warning in &resolved.warnings {
                    let _ = writeln!(out, "  warning    {warning}");
                }
                let _ = writeln!(
                    out,
                    "  servers    {}",
                    resolved
                        .servers
                        .iter()
                        .map(|s| s.address.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                let _ = writeln!(out, "  api keys   {}", resolved.api_keys.len());
                let _ = writeln!(out, "  tenants    {}", resolved.tenants.len());
                if resolved.admin_tokens.is_empty() {
                    let _ = writeln!(out, "  admin API  off");
                } else {
                    let _ = writeln!(
                        out,
                        "  admin API  on: {}",
                        resolved
                            .admin_tokens
                            .iter()
                            .map(|t| format!(
                                "{} ({})",
                                t.name,
                                t.scopes
                                    .iter()
                                    .map(|s| s.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ))
                            .collect::<Vec<_>>()
                            .join("; ")
                    );
                }
            }
            print_all(&out)?;
            if probe {
                probe_servers(&resolved)?;
            }
            Ok(())
        }
        Command::Worker(args) => worker(args),
        Command::KeyHash => {
            let mut key = String::new();
            std::io::stdin().read_line(&mut key)?;
            let key = key.trim();
            anyhow::ensure!(!key.is_empty(), "no key on standard input");
            let hex = hex::encode(ringmaster_config::key_digest(key));
            #[allow(clippy::print_stdout)]
            {
                println!("{hex}");
            }
            Ok(())
        }
        Command::DefaultConfig => {
            #[allow(clippy::print_stdout)]
            {
                print!("{DEFAULT_CONFIG_TOML}");
            }
            Ok(())
        }
    }
}

/// Writes `text` to standard output; a reader that closed it early (`| head`) is not an
/// error, and nothing panics on it.
fn print_all(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// `check-config --probe`: connects to each remote server as a request would (the TLS
/// handshake with the server's CA file, name and client certificate for `https://`; a TCP
/// connection for `http://`) and prints one line per server, `OK` or why not. `Err` when one
/// failed, after every line is out.
fn probe_servers(config: &ringmaster_config::Config) -> anyhow::Result<()> {
    use ringmaster_config::ServerAddress;
    let timeout = config.upstream.connect_timeout;
    let alpn: &[u8] = if config.upstream.http2_prior_knowledge {
        b"h2"
    } else {
        b"http/1.1"
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut lines = String::new();
    let mut failed = 0usize;
    let mut remote = 0usize;
    for server in &config.servers {
        let ServerAddress::Remote { url, name, tls } = &server.address else {
            continue;
        };
        remote += 1;
        let outcome = runtime.block_on(async {
            if !tls {
                return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(name))
                    .await
                {
                    Ok(Ok(_)) => Ok("connects".to_owned()),
                    Ok(Err(e)) => Err(format!("cannot connect to {name}: {e}")),
                    Err(_) => Err(format!("no connection to {name} within {timeout:?}")),
                };
            }
            let files = ringmaster_tls::ClientTlsFiles {
                ca_file: server.access.ca_file.clone(),
                client_cert: server.access.client_cert.clone(),
            };
            let client =
                ringmaster_tls::client_config(&files, &[alpn]).map_err(|e| e.to_string())?;
            let host = server.address.host().unwrap_or_default();
            ringmaster_tls::probe(client, name, &host, timeout)
                .await
                .map_err(|e| e.to_string())
        });
        let said = match outcome {
            Ok(agreed) => format!("OK ({agreed})"),
            Err(why) => {
                failed += 1;
                why
            }
        };
        lines.push_str(&format!("  probe      {} ({url}): {said}\n", server.id));
    }
    if remote == 0 {
        lines.push_str("  probe      no remote servers to probe\n");
    }
    print_all(&lines)?;
    anyhow::ensure!(
        failed == 0,
        "{failed} of {remote} remote servers failed the probe"
    );
    Ok(())
}

/// How `check-config` shows a listener's TLS.
fn tls_line(tls: Option<&ringmaster_config::TlsSettings>) -> String {
    match tls {
        None => " (plain HTTP)".to_owned(),
        Some(tls) => format!(
            " (TLS, {}{})",
            tls.cert.display(),
            tls.client_ca
                .as_ref()
                .map(|ca| format!("; client certificates of {}", ca.display()))
                .unwrap_or_default()
        ),
    }
}

/// The models a config serves, as `check-config` shows them: the top-level `models` names
/// only what servers that list none of their own are taken to serve, so servers that list
/// theirs (or are asked at run time) are named as such, not hidden behind that default.
fn models_line(config: &ringmaster_config::Config) -> String {
    use ringmaster_config::ServerAddress;
    let mut named: Vec<String> = Vec::new();
    let mut asked = 0;
    let mut defaulted = config.servers.is_empty();
    for server in &config.servers {
        match (&server.models, &server.address) {
            (Some(models), _) => {
                for model in models {
                    if !named.contains(model) {
                        named.push(model.clone());
                    }
                }
            }
            (None, ServerAddress::Simulated { .. }) => defaulted = true,
            (None, ServerAddress::Model { path, .. }) => {
                named.push(format!("the model in {}", path.display()));
            }
            (None, ServerAddress::Remote { .. }) => asked += 1,
        }
    }
    if defaulted {
        for model in &config.models {
            if !named.contains(model) {
                named.push(model.clone());
            }
        }
    }
    if asked > 0 {
        named.push(format!(
            "what {asked} server(s) list at /v1/models (asked at start)"
        ));
    }
    named.join(", ")
}

/// The router variants as the start-up line names them: the one variant's source alone, or
/// each variant with its weight (and the shadow as such).
fn router_line(variants: &[ringmaster_config::RouterVariantSpec]) -> String {
    match variants {
        [only] if !only.shadow => only.source.to_string(),
        _ => variants
            .iter()
            .map(|v| match v.shadow {
                true => format!("{} {} (shadow)", v.name, v.source),
                false => format!("{} {} (weight {})", v.name, v.source, v.weight),
            })
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// `on` or `off`, as a start-up line says a switch.
fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// Where the admin API answers, as the start-up line says it: `off` without a token, `on
/// this port` on the public listener, or its own listener's address (`with TLS` when it has
/// its own certificate).
fn admin_line(config: &ringmaster_config::Config, own: Option<std::net::SocketAddr>) -> String {
    if config.admin_tokens.is_empty() {
        return "off".to_owned();
    }
    match (own, &config.admin_listener) {
        (Some(address), Some(admin)) if admin.tls.is_some() => format!("{address} with TLS"),
        (Some(address), _) => address.to_string(),
        (None, _) => "on this port".to_owned(),
    }
}

fn serve(args: ServeArgs, log_format: LogFormat) -> anyhow::Result<()> {
    let process_started = std::time::Instant::now();
    let mut raw = match &args.config {
        Some(path) => RawConfig::from_file(path)?,
        None => RawConfig::embedded_default(),
    };
    if let Some(listen) = args.listen {
        raw.listen = Some(listen);
    }
    if let Some(router) = args.router {
        // The one router: it replaces the file's variants (and its deprecated strategy).
        let routing = raw.routing.get_or_insert_with(Default::default);
        routing.router = Some(router);
        routing.strategy = None;
        if let Some(policies) = raw.policies.as_mut() {
            policies.router = None;
        }
    }
    // What the start chose about the model, said once logging is set up (a line logged
    // before it goes nowhere).
    let mut no_model_at = None;
    let mut serving_model = None;
    let model = match (&args.model, &args.config, args.simulated) {
        (Some(path), _, _) => Some(path.clone()),
        (None, None, false) => {
            let cached = ringmaster_gpu_runtime::model::default_model_path();
            if cached.is_file() {
                Some(cached)
            } else {
                no_model_at = Some(cached);
                None
            }
        }
        _ => None,
    };
    if let Some(path) = model {
        let address = format!("gguf:{}", path.display());
        let name = ringmaster_config::ServerAddress::parse(&address)
            .map_err(anyhow::Error::msg)?
            .default_id()
            .to_lowercase();
        serving_model = Some((path.clone(), name.clone()));
        raw.servers = Some(vec![ringmaster_config::RawServer {
            address,
            id: Some(name.clone()),
            weight: None,
            models: None,
            ..Default::default()
        }]);
        raw.models = Some(vec![name]);
    }
    if let Some(threads) = args.threads {
        raw.model.get_or_insert_with(Default::default).threads = Some(threads);
    }
    if let Some(url) = args.cluster {
        raw.cluster.get_or_insert_with(Default::default).url = Some(url);
    }
    let mut unused_replica = None;
    if let Some(name) = args.replica {
        match raw.cluster.as_mut() {
            Some(cluster) => cluster.name = Some(name),
            None => unused_replica = Some(name),
        }
    }
    if let Some(scale) = args.sim_time_scale {
        raw.simulator
            .get_or_insert_with(Default::default)
            .time_scale = Some(scale);
    }
    let config = raw.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ringmaster")
        .build()
        .context("starting the async runtime")?;
    // The gRPC exporter's channel lives on the runtime.
    let telemetry = {
        let _entered = runtime.enter();
        init_logging(log_format, Some(&config.telemetry))?
    };
    if let Some(cached) = no_model_at {
        info!(
            model = %cached.display(),
            "no model in the model cache (run `cargo xtask model` to fetch SmolLM2); serving simulated GPU servers"
        );
    }
    if let Some((path, name)) = serving_model {
        info!(model = %path.display(), served_as = %name, "serving a model on the CPU");
    }
    if let Some(name) = unused_replica {
        tracing::warn!(
            replica = %name,
            "--replica names a replica of a cluster; without --cluster or [cluster] it has no effect"
        );
    }
    for warning in &config.warnings {
        tracing::warn!(%warning, "config.deprecated");
    }
    if let Some(export) = &config.telemetry.export {
        info!(
            endpoint = %export.endpoint,
            protocol = export.protocol.as_str(),
            sample_ratio = config.telemetry.sample_ratio,
            propagate = config.telemetry.propagate,
            "telemetry.exporting"
        );
    }
    let served = runtime.block_on(async move {
        let listen = config.listen;
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let admin_listener =
            match &config.admin_listener {
                Some(admin) => Some(TcpListener::bind(admin.listen).await.with_context(|| {
                    format!("cannot listen on {} ([admin] listen)", admin.listen)
                })?),
                None => None,
            };
        let cluster = match &config.cluster {
            None => None,
            Some(settings) => {
                let replica = settings.name.clone().unwrap_or_else(|| {
                    listener
                        .local_addr()
                        .map_or_else(|_| listen.to_string(), |a| a.to_string())
                });
                let mut spec = ringmaster_cluster::ClusterSpec::new(&settings.url, replica);
                spec.namespace = settings.namespace.clone();
                spec.deadline = settings.deadline;
                spec.fail_open = settings.fail_open;
                spec.tls = ringmaster_cluster::ClusterTls {
                    ca_file: settings.ca_file.clone(),
                    client_cert: settings.client_cert.clone(),
                };
                Some(
                    ringmaster_cluster::Cluster::connect(spec, std::time::Duration::from_secs(10))
                        .await
                        .with_context(|| format!("joining the cluster at {}", settings.url))?,
                )
            }
        };
        let gateway =
            Gateway::start_in(config, cluster.clone()).context("starting the GPU server pool")?;
        // A replica applies the fleet's configuration up to its head before it serves.
        let applier = ringmaster_admin::follow_cluster(&gateway)
            .await
            .context("reading the cluster's configuration log")?;
        ringmaster_admin::mount_with(&gateway, applier);
        let cold_start = process_started.elapsed();
        gateway
            .metrics()
            .cold_start_seconds
            .set(cold_start.as_secs_f64());
        let admin_address = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
        info!(
            cold_start_ms = cold_start.as_millis() as u64,
            address = %listener.local_addr()?,
            servers = gateway.pool().snapshot().servers.len(),
            router = %router_line(&gateway.config().policies.router),
            tls = %on_off(gateway.config().tls.is_some()),
            admin = %admin_line(gateway.config(), admin_address),
            "gateway.listening"
        );
        // The admin listener stops with the public one.
        let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin = admin_listener.map(|listener| {
            tokio::spawn(ringmaster_gateway::serve_admin(
                gateway.clone(),
                listener,
                async move {
                    let _ = admin_stopped.await;
                },
            ))
        });
        #[cfg(unix)]
        tokio::spawn(reload_on_sighup(std::sync::Arc::downgrade(&gateway)));
        ringmaster_gateway::serve(gateway, listener, shutdown_signal()).await?;
        drop(stop_admin);
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        if let Some(cluster) = cluster {
            // Leave the fleet at once rather than when the lease lapses.
            let _ = cluster.drop_lease().await;
        }
        info!("gateway.stopped");
        Ok(())
    });
    // The spans still buffered go out before the runtime (the gRPC channel's home) stops.
    if let Some(telemetry) = telemetry {
        runtime.block_on(async move {
            let _ = tokio::task::spawn_blocking(move || drop(telemetry)).await;
        });
    }
    served
}

fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    use ringmaster_gpu_runtime::model::{ModelExecutor, ModelOptions, default_model_path};
    let process_started = std::time::Instant::now();
    let role = ringmaster_worker::transfer::Role::parse(&args.role).unwrap_or_default();
    let trust = worker_trust(role, &args.secret_env, &args.kv_peers)?;
    let role = (role, trust);
    if args.simulated {
        let name = args.name.clone().unwrap_or_else(|| "sim".to_owned());
        let mut config = ringmaster_gpu_runtime::EngineConfig::simulated(name.clone());
        config.max_running = args.max_running;
        config.step_token_budget = args.step_token_budget.unwrap_or(CPU_STEP_TOKEN_BUDGET);
        config.time_scale = args.time_scale;
        if let Some(blocks) = args.kv_blocks {
            config.kv_blocks = blocks;
        }
        config.validate().context("invalid engine settings")?;
        let starter: EngineStarter =
            Box::new(|config| Ok(ringmaster_gpu_runtime::EngineHandle::spawn(config)?));
        return run_worker((args.listen, role), name, config, starter, process_started);
    }
    let path = args.model.unwrap_or_else(default_model_path);
    let name = match args.name {
        Some(name) => name,
        None => ringmaster_config::ServerAddress::parse(&format!("gguf:{}", path.display()))
            .map_err(anyhow::Error::msg)?
            .default_id()
            .to_lowercase(),
    };
    let mut config = ringmaster_gpu_runtime::EngineConfig::simulated(name.clone());
    config.max_running = args.max_running;
    config.step_token_budget = args.step_token_budget.unwrap_or(CPU_STEP_TOKEN_BUDGET);
    config.time_scale = 1.0;
    let device = parse_device(&args.device)?;
    let executor: EngineStarter = match device {
        None => {
            let kv_blocks = args.kv_blocks.unwrap_or(ModelOptions::default().kv_blocks);
            config.kv_blocks = kv_blocks;
            let isa = match args.kernels.as_str() {
                "auto" => None,
                name => Some(
                    ringmaster_gpu_runtime::model::Isa::from_name(name).ok_or_else(|| {
                        anyhow::anyhow!("--kernels {name:?} is not one of auto, avx2, avx, scalar")
                    })?,
                ),
            };
            let executor = ModelExecutor::load(
                &path,
                &ModelOptions {
                    kv_blocks,
                    threads: args.threads,
                    isa,
                },
            )
            .with_context(|| format!("loading {}", path.display()))?;
            info!(
                model = %path.display(),
                load_ms = executor.load_time().as_millis() as u64,
                kernels = executor.cpu().isa().name(),
                threads = args.threads,
                kv_blocks,
                "worker.model_loaded"
            );
            Box::new(move |config| {
                Ok(ringmaster_gpu_runtime::EngineHandle::spawn_with_executor(
                    config, executor,
                )?)
            })
        }
        Some(ordinal) => {
            let executor = load_gpu(&path, ordinal, args.kv_blocks)?;
            config = match args.step_token_budget {
                Some(budget) => config.gpu_step(budget),
                None => config.sized_for_gpu(),
            };
            config.kv_blocks = executor.0;
            executor.1
        }
    };
    config.validate().context("invalid engine settings")?;
    run_worker((args.listen, role), name, config, executor, process_started)
}

/// Whom a worker of `role` takes a split request's legs from: the secret in `secret_env` and
/// the prefill workers `peers` (a prefill or decode worker without what it needs is an error;
/// a `both` worker without a secret serves whole requests only, and says so).
fn worker_trust(
    role: ringmaster_worker::transfer::Role,
    secret_env: &str,
    peers: &[String],
) -> anyhow::Result<ringmaster_worker::transfer::Trust> {
    use ringmaster_worker::transfer::{Peer, Role, Trust};
    let secret = ringmaster_tls::credential::WorkerSecret::from_env(secret_env)?;
    let peers = peers
        .iter()
        .map(|p| Peer::parse(p).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    match (role, &secret) {
        (Role::Prefill | Role::Decode, None) => anyhow::bail!(
            "--role {} takes a split request's legs only from its gateways, which sign them \
             with a secret the workers share: set {secret_env} (at least 16 bytes, the same \
             as the gateway's [workers] secret_env)",
            role.as_str()
        ),
        (Role::Decode, Some(_)) if peers.is_empty() => anyhow::bail!(
            "--role decode fetches KV blocks only from the prefill workers it is told of: \
             --kv-peer HOST:PORT for each (as the gateway reaches them)"
        ),
        (Role::Both, None) => info!(
            secret_env,
            "worker.transfers_off: no shared secret, so split requests' legs are served whole"
        ),
        _ => {}
    }
    Ok(Trust { secret, peers })
}

/// Serves one engine over HTTP until SIGINT or SIGTERM.
fn run_worker(
    (listen, (role, trust)): (
        String,
        (
            ringmaster_worker::transfer::Role,
            ringmaster_worker::transfer::Trust,
        ),
    ),
    name: String,
    config: ringmaster_gpu_runtime::EngineConfig,
    executor: EngineStarter,
    process_started: std::time::Instant,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ringmaster-worker")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(&listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let engine = executor(config)?;
        info!(
            address = %listener.local_addr()?,
            model = %name,
            cold_start_ms = process_started.elapsed().as_millis() as u64,
            "worker.listening"
        );
        ringmaster_worker::serve(
            ringmaster_worker::Worker::trusting(engine, name, role, trust),
            listener,
            shutdown_signal(),
        )
        .await?;
        info!("worker.stopped");
        Ok(())
    })
}

/// `cpu` → `None`; `cuda` or `cuda:N` → the GPU's ordinal.
fn parse_device(device: &str) -> anyhow::Result<Option<usize>> {
    match device {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Some)
            .ok_or_else(|| anyhow::anyhow!("--device {other:?} is not cpu, cuda or cuda:N")),
    }
}

/// A CPU worker's step budget when `--step-token-budget` is not given.
const CPU_STEP_TOKEN_BUDGET: u32 = 512;

/// An engine starter for the model on GPU `ordinal`, and the KV blocks its pool holds.
type EngineStarter = Box<
    dyn FnOnce(
            ringmaster_gpu_runtime::EngineConfig,
        ) -> anyhow::Result<ringmaster_gpu_runtime::EngineHandle>
        + Send,
>;

#[cfg(feature = "cuda")]
fn load_gpu(
    path: &std::path::Path,
    ordinal: usize,
    kv_blocks: Option<u32>,
) -> anyhow::Result<(u32, EngineStarter)> {
    let executor = ringmaster_gpu_runtime::model::GpuExecutor::load(path, ordinal, kv_blocks)
        .with_context(|| format!("loading {} onto GPU {ordinal}", path.display()))?;
    let blocks = executor.kv_blocks();
    info!(
        model = %path.display(),
        gpu = %executor.device_name(),
        load_ms = executor.load_time().as_millis() as u64,
        weight_bytes = executor.weight_bytes(),
        kv_blocks = blocks,
        "worker.model_loaded"
    );
    Ok((
        blocks,
        Box::new(move |config| {
            Ok(ringmaster_gpu_runtime::EngineHandle::spawn_with_executor(
                config, executor,
            )?)
        }),
    ))
}

#[cfg(not(feature = "cuda"))]
fn load_gpu(
    _path: &std::path::Path,
    ordinal: usize,
    _kv_blocks: Option<u32>,
) -> anyhow::Result<(u32, EngineStarter)> {
    anyhow::bail!(
        "--device cuda:{ordinal} needs a build with CUDA support: cargo build --release -p ringmaster --features cuda"
    )
}

/// Resolves on the first SIGINT or SIGTERM, which starts the drain (in-flight requests get
/// `shutdown_grace_seconds`). A second one during the drain ends the process at once, logged
/// as `shutdown.forced`, with the status a shell gives a process that signal killed: an
/// operator who presses Ctrl-C again does not wait out the grace period, as in most servers.
async fn shutdown_signal() {
    let mut signals = Signals::new();
    let first = signals.next().await;
    info!(signal = first.name(), "gateway.shutdown_requested");
    tokio::spawn(async move {
        let second = signals.next().await;
        tracing::warn!(
            signal = second.name(),
            "shutdown.forced: a second signal during the drain; in-flight requests are cut off"
        );
        std::process::exit(128 + second.number());
    });
}

/// The signals that stop the process: SIGINT, and SIGTERM where there is one. Each is one
/// stream, listened to from its creation on, so a signal that arrives while nobody waits is
/// kept for the next [`Signals::next`] rather than lost.
struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

/// A stopping signal that arrived.
#[derive(Clone, Copy)]
enum StopSignal {
    Interrupt,
    #[cfg(unix)]
    Terminate,
}

impl StopSignal {
    fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            #[cfg(unix)]
            Self::Terminate => "SIGTERM",
        }
    }

    /// Its number, for the exit status (128 + it).
    fn number(self) -> i32 {
        match self {
            Self::Interrupt => 2,
            #[cfg(unix)]
            Self::Terminate => 15,
        }
    }
}

impl Signals {
    /// Catches both from now on (a handler that cannot be installed leaves its signal's
    /// default action, which stops the process anyway).
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next signal. Cancel safe.
    async fn next(&mut self) -> StopSignal {
        #[cfg(unix)]
        {
            async fn on(signal: Option<&mut tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = on(self.interrupt.as_mut()) => StopSignal::Interrupt,
                () = on(self.terminate.as_mut()) => StopSignal::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            StopSignal::Interrupt
        }
    }
}

/// SIGHUP re-reads every policy file (the config's `[[policies.router]]` file sources).
#[cfg(unix)]
async fn reload_on_sighup(gateway: std::sync::Weak<Gateway>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        return;
    };
    while hangups.recv().await.is_some() {
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        info!("gateway.sighup_reload");
        let _ = tokio::task::spawn_blocking(move || {
            gateway.reload_tls();
            gateway.reload_policies()
        })
        .await;
    }
}

/// Logs to stderr as `RUST_LOG` says, and, when `telemetry` names a collector, the gateway's
/// request spans to it. Returns the trace pipeline, which flushes when dropped.
fn init_logging(
    format: LogFormat,
    telemetry: Option<&ringmaster_config::TelemetrySettings>,
) -> anyhow::Result<Option<ringmaster_telemetry::Telemetry>> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    // Colour codes only for a person at a terminal: a log file or a collector reads them as
    // noise (and `NO_COLOR` turns them off anyway).
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let traces = match telemetry {
        Some(settings) => ringmaster_telemetry::layer(settings)?,
        None => None,
    };
    let Some((traces, pipeline)) = traces else {
        // No traces: one global filter, exactly as before there were any.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_ansi(colour)
            .with_writer(std::io::stderr);
        match format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
        return Ok(None);
    };
    // The log lines keep `RUST_LOG`; the exporter takes the gateway's spans at INFO (and the
    // warnings inside them as span events) whatever the log level is.
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Text => logs.with_filter(filter()).boxed(),
        LogFormat::Json => logs.json().with_filter(filter()).boxed(),
    };
    // The exporter takes the spans the gateway marks with `otel.kind` (a sampled request's),
    // and warnings and errors as events on them.
    let spans = tracing_subscriber::filter::filter_fn(|meta| {
        if meta.is_span() {
            meta.fields().field("otel.kind").is_some()
        } else {
            *meta.level() <= tracing::Level::WARN && meta.target().starts_with("ringmaster")
        }
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces.with_filter(spans))
        .init();
    Ok(Some(pipeline))
}

/// `ringmaster bench replay`: each scenario's table to stdout, its JSON and Markdown under
/// `--out`, and the routing section of `--benchmarks` regenerated from all of them.
fn bench_replay(args: ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.scenarios.is_empty(),
        "name at least one scenario file"
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut sections = Vec::new();
    for path in &args.scenarios {
        let scenario = ringmaster_replay::Scenario::from_file(path)?;
        let name = path.file_stem().map_or_else(
            || "scenario".to_owned(),
            |s| s.to_string_lossy().into_owned(),
        );
        let runtime = ringmaster_replay::runtime()?;
        let started = std::time::Instant::now();
        let bar = policy_cmd::replay_bar(scenario.runs(), &name);
        let report = runtime.block_on(ringmaster_replay::run_scenario(&scenario, |router| {
            bar.inc(1);
            bar.set_message(router.to_owned());
            info!(scenario = %name, router, "replay.router");
        }))?;
        bar.finish_and_clear();
        info!(scenario = %name, elapsed_s = started.elapsed().as_secs_f64(), "replay.done");
        let section = ringmaster_replay::publish::write(&report, &name, &args.out)?;
        #[allow(clippy::print_stdout)]
        {
            println!("{section}");
        }
        sections.push(section);
    }
    if let Some(doc) = &args.benchmarks {
        let content = sections.join("\n");
        match &args.section {
            Some(name) => ringmaster_replay::publish::splice_named(doc, name, &content)?,
            None => ringmaster_replay::publish::splice(doc, &content)?,
        }
        info!(file = %doc.display(), "replay.benchmarks_updated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{admin_line, router_line};

    fn config(toml: &str) -> ringmaster_config::Config {
        ringmaster_config::RawConfig::from_toml(toml)
            .unwrap()
            .validate_with_env(|_| None)
            .unwrap()
    }

    /// The start-up line's fields read as words: a switch is `on` or `off`, an address is an
    /// address, and nothing is `None`, `Some(…)` or a Rust struct (it once said
    /// `admin_address=None`).
    #[test]
    fn the_start_up_line_reads_as_words() {
        let token = "admin_token = \"an-admin-token-long-enough\"\n";
        let alone = config("");
        assert_eq!(admin_line(&alone, None), "off");
        assert_eq!(admin_line(&config(token), None), "on this port");
        let own = config(&format!("{token}[admin]\nlisten = \"127.0.0.1:9090\"\n"));
        let address = "127.0.0.1:9090".parse().ok();
        assert_eq!(admin_line(&own, address), "127.0.0.1:9090");
        assert_eq!(
            router_line(&alone.policies.router),
            "builtin:prefix-affinity"
        );
        let variants = config(
            "[[policies.router]]\nname = \"a\"\nsource = \"builtin:round-robin\"\n\
             [[policies.router]]\nname = \"b\"\nsource = \"builtin:least-loaded\"\nweight = 10\n\
             [[policies.router]]\nname = \"s\"\nsource = \"builtin:consistent-hash\"\nshadow = true\n",
        );
        let line = router_line(&variants.policies.router);
        assert_eq!(
            line,
            "a builtin:round-robin (weight 100), b builtin:least-loaded (weight 10), \
             s builtin:consistent-hash (shadow)"
        );
        for text in [line, admin_line(&own, address)] {
            assert!(
                !text.contains("None") && !text.contains("Some(") && !text.contains('{'),
                "{text}"
            );
        }
    }
}
