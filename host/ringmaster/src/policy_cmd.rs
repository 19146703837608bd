//! `ringmaster policy`: the policy author's commands (scaffold, build, check, replay against
//! baselines, push into a running gateway). The work is `ringmaster-policy-kit`'s and the
//! replay's; this module parses, prints and talks HTTP.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ringmaster_policy_kit::{build, check, scaffold};

/// `ringmaster policy ...`.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// Scaffold a standalone policy project (its build file, the WIT, the SDK, a sample
    /// router and its unit test).
    New {
        /// The policy's name (lower-case letters, digits and `-`): the directory, the crate
        /// or module, and the component `NAME.wasm`.
        name: String,
        /// rust, python, js or c.
        #[arg(long, default_value = "rust")]
        lang: String,
        /// The world it targets.
        #[arg(long, default_value = "router")]
        world: String,
        /// Where the project goes (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Build a project to a component (`DIR/NAME.wasm`), installing the toolchain where it
    /// can.
    Build {
        /// The project (default: the current directory).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// For a Rust project with no Wasm toolchain: install Debian's (rustc-web and its
        /// standard library's source, about 900 MB) with apt-get, as root. Without it the
        /// build says what is missing and how to get it.
        #[arg(long)]
        install_toolchain: bool,
    },
    /// Load a component as the gateway would, probe it, and print its size and timings.
    Check {
        /// The component.
        file: PathBuf,
    },
    /// Replay a trace through a router component next to baselines and the cache oracles.
    Test {
        /// The router component.
        file: PathBuf,
        /// The trace: Mooncake JSONL, or an Azure CSV (prefixes then made up).
        #[arg(long)]
        trace: PathBuf,
        /// Simulated servers.
        #[arg(long, default_value_t = 8)]
        servers: usize,
        /// Replay only the first N requests.
        #[arg(long)]
        requests: Option<usize>,
        /// Routers to compare against (`builtin:NAME` or a component path).
        #[arg(long, default_values_t = ["builtin:prefix-affinity".to_owned(), "builtin:consistent-hash".to_owned()])]
        against: Vec<String>,
        /// A server that runs slower than the others, as `replay-N=FACTOR` (repeatable): how a
        /// router copes with a slow or busy machine.
        #[arg(long = "slow", value_name = "replay-N=FACTOR")]
        slow: Vec<String>,
        /// A disaggregated layout of the servers (`xPyD`: x prefill and y decode servers):
        /// each router is replayed on it beside the aggregated fleet, and the goodput table
        /// shows the requests it split (for a pair router of `ringmaster:policy@0.3.0`).
        #[arg(long, value_name = "xPyD")]
        layout: Option<String>,
        /// With `--layout`: multiples of the trace's arrival rate to replay at.
        #[arg(long, value_delimiter = ',', default_values_t = [1.0], requires = "layout")]
        rates: Vec<f64>,
        /// Where the JSON, Markdown and plots go.
        #[arg(long, default_value = "target/policy-test")]
        out: PathBuf,
    },
    /// Load a component into a running gateway's slot (the admin token from
    /// `RINGMASTER_ADMIN_TOKEN`), printing the version hash.
    Push(PushArgs),
}

/// `ringmaster policy push`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// The component.
    file: PathBuf,
    /// router, admission or safety-filter.
    #[arg(long, default_value = "router")]
    slot: String,
    /// The gateway's address.
    #[arg(
        long,
        default_value = "http://127.0.0.1:8080",
        env = "RINGMASTER_GATEWAY"
    )]
    gateway: String,
    /// The router variant to create or swap.
    #[arg(long, default_value = "default")]
    variant: String,
    /// Its share of live traffic (relative to the other variants' weights).
    #[arg(long, conflicts_with = "shadow")]
    weight: Option<u32>,
    /// Run it as the shadow: it decides on every request, nothing follows its answer.
    #[arg(long)]
    shadow: bool,
    /// In a cluster, return only once every live replica applied it (a gateway alone has
    /// applied it when it answers); fail if that takes longer than --wait-timeout.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits, in seconds.
    #[arg(long, default_value_t = 60, requires = "wait")]
    wait_timeout: u64,
    /// The admin token.
    #[arg(long, env = "RINGMASTER_ADMIN_TOKEN", hide_env_values = true)]
    token: String,
}

#[allow(clippy::print_stdout)]
pub fn run(command: PolicyCommand) -> anyhow::Result<()> {
    match command {
        PolicyCommand::New {
            name,
            lang,
            world,
            dir,
        } => {
            let lang = scaffold::Lang::parse(&lang)?;
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let files = scaffold::new_project(&dir, &name, lang, &world)?;
            println!("wrote a {lang} {world} in {}:", dir.display());
            for file in files {
                println!("  {}", file.display());
            }
            println!(
                "next: cd {} && {} && ringmaster policy build",
                dir.display(),
                lang.test_command()
            );
            Ok(())
        }
        PolicyCommand::Build {
            dir,
            install_toolchain,
        } => {
            let spinner = indicatif::ProgressBar::new_spinner();
            spinner.enable_steady_tick(std::time::Duration::from_millis(120));
            let built = build::build(&dir, install_toolchain, &mut |step| {
                // Each step stays on screen (or in the log, where there is no spinner).
                if spinner.is_hidden() {
                    eprintln!("==> {step}");
                } else {
                    spinner.println(format!("==> {step}"));
                }
                spinner.set_message(step.to_owned());
            });
            spinner.finish_and_clear();
            let built = built?;
            println!(
                "built {} ({} bytes) with {} in {:.1} s",
                built.path.display(),
                built.size,
                built.toolchain,
                built.elapsed.as_secs_f64()
            );
            Ok(())
        }
        PolicyCommand::Check { file } => {
            let scratch = std::env::temp_dir()
                .join(format!("ringmaster-policy-check-{}", std::process::id()));
            std::fs::create_dir_all(&scratch)
                .with_context(|| format!("cannot create {}", scratch.display()))?;
            let result = check::check(&file, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            let report = result?;
            let article = if report.world.starts_with('a') {
                "an"
            } else {
                "a"
            };
            println!(
                "{} is {article} {} component (ringmaster:policy@{}):",
                file.display(),
                report.world,
                report.contract
            );
            println!("  size          {} bytes", report.size);
            println!(
                "  compile       {:.1} ms (with the load probes)",
                ms(report.compile)
            );
            println!("  cached load   {:.1} ms", ms(report.cached_load));
            println!(
                "  instantiate   {:.1} µs (median of {} fresh instances)",
                report.instantiate.as_secs_f64() * 1e6,
                ringmaster_policy_kit::check::INSTANTIATIONS
            );
            if let (Some(median), Some(p99)) = (report.call_median, report.call_p99) {
                println!(
                    "  per call      {:.2} µs median, {:.2} µs p99 ({} calls, 8 servers)",
                    median.as_secs_f64() * 1e6,
                    p99.as_secs_f64() * 1e6,
                    check::CALLS
                );
            }
            if let Some(fuel) = report.call_fuel {
                println!(
                    "  fuel          {fuel} per call (median; about one per Wasm instruction)"
                );
            }
            if let Some(answer) = report.sample_answer {
                println!("  first answer  {answer}");
            }
            if let (n @ 1.., Some(first)) = report.faults {
                println!(
                    "  faults        {n} of {} calls (each would fall back to the ring); first: {first}",
                    check::CALLS
                );
            }
            Ok(())
        }
        PolicyCommand::Test {
            file,
            trace,
            servers,
            requests,
            against,
            slow,
            layout,
            rates,
            out,
        } => replay(
            &file,
            &trace,
            (servers, requests),
            (&against, &slow),
            (layout.as_deref(), &rates),
            &out,
        ),
        PolicyCommand::Push(args) => push(&args),
    }
}

/// A bar over a replay's routers (hidden when stderr is not a terminal).
pub fn replay_bar(routers: usize, scenario: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(routers as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{prefix} [{bar:30}] router {pos}/{len}: {msg} ({elapsed})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(scenario.to_owned());
    bar
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A scenario for one router and its baselines, written as the scenario files are.
fn replay(
    file: &Path,
    trace: &Path,
    (servers, requests): (usize, Option<usize>),
    (against, slow): (&[String], &[String]),
    (layout, rates): (Option<&str>, &[f64]),
    out: &Path,
) -> anyhow::Result<()> {
    let absolute = |p: &Path| -> anyhow::Result<String> {
        Ok(p.canonicalize()
            .with_context(|| format!("{}", p.display()))?
            .display()
            .to_string())
    };
    let mut routers = vec![absolute(file)?];
    routers.extend(against.iter().cloned());
    let azure = trace.extension().is_some_and(|e| e == "csv");
    let mut text = format!(
        "trace = {:?}\nservers = {servers}\nrouters = {:?}\n",
        absolute(trace)?,
        routers
    );
    if let Some(n) = requests {
        text.push_str(&format!("requests = {n}\n"));
    }
    if !slow.is_empty() {
        let mut pairs = Vec::new();
        for entry in slow {
            let (server, factor) = entry
                .split_once('=')
                .and_then(|(s, f)| Some((s, f.parse::<f64>().ok()?)))
                .with_context(|| {
                    format!("--slow {entry:?}: write replay-N=FACTOR, e.g. replay-7=3")
                })?;
            pairs.push(format!("{server:?} = {factor}"));
        }
        text.push_str(&format!("slowdown = {{ {} }}\n", pairs.join(", ")));
    }
    if azure {
        text.push_str("format = \"azure\"\n[synthetic]\n");
    }
    if let Some(layout) = layout {
        // The SLOs only rank the rows; the table's split counts and latencies are the point.
        text.push_str(&format!(
            "[disaggregation]\nlayouts = [\"aggregated\", {layout:?}]\nrates = {rates:?}\n\
             [[disaggregation.slo]]\nname = \"5 s / 50 ms\"\nttft_s = 5.0\nitl_s = 0.05\n"
        ));
    }
    let scenario = ringmaster_replay::Scenario::from_toml(&text, Path::new("."))
        .map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let name = file
        .file_stem()
        .map_or_else(|| "policy".to_owned(), |s| s.to_string_lossy().into_owned());
    let runtime = ringmaster_replay::runtime()?;
    let bar = replay_bar(scenario.runs(), &name);
    let report = runtime.block_on(ringmaster_replay::run_scenario(&scenario, |router| {
        bar.inc(1);
        bar.set_message(router.to_owned());
    }))?;
    bar.finish_and_clear();
    let section = ringmaster_replay::publish::write(&report, &name, out)?;
    #[allow(clippy::print_stdout)]
    {
        println!("{section}");
    }
    Ok(())
}

fn push(args: &PushArgs) -> anyhow::Result<()> {
    let PushArgs {
        file,
        slot,
        gateway,
        variant,
        weight,
        shadow,
        wait,
        wait_timeout,
        token,
    } = args;
    let (slot, shadow) = (slot.as_str(), *shadow);
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let base = gateway.trim_end_matches('/');
    let mut url = match slot {
        "router" => {
            let mut url = format!("{base}/admin/policies/router?variant={variant}");
            if let Some(w) = weight {
                url.push_str(&format!("&weight={w}"));
            }
            if shadow {
                url.push_str("&shadow=true");
            }
            url
        }
        "admission" | "safety-filter" => {
            anyhow::ensure!(
                weight.is_none() && !shadow,
                "--weight and --shadow are for the router slot: the {slot} slot runs one policy"
            );
            format!("{base}/admin/policies/{slot}")
        }
        other => anyhow::bail!("--slot {other}: not router, admission or safety-filter"),
    };
    if *wait {
        // The gateway waits a while itself (and says `applied_everywhere`); the rest of the
        // wait is ours, on /admin/cluster.
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str("wait=true");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = reqwest::Client::new();
    let (status, body) = runtime.block_on(async {
        // A cheap authenticated call first: a wrong token or address is told apart before
        // megabytes of component are sent (the gateway refuses an unauthorised upload
        // before reading it, which a client sees as a broken connection).
        let admin = format!("{base}/admin/policies");
        let probe = client
            .get(&admin)
            .bearer_auth(token)
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway at {gateway}"))?;
        anyhow::ensure!(
            probe.status().is_success(),
            "the gateway at {gateway} refused the admin token ({}): {}",
            probe.status(),
            probe.text().await.unwrap_or_default()
        );
        let response = client
            .put(&url)
            .bearer_auth(token)
            .header("content-type", "application/wasm")
            .body(bytes)
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway at {gateway}"))?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        anyhow::Ok((status, body))
    })?;
    anyhow::ensure!(
        status.is_success(),
        "the gateway refused the component ({status}): {body}"
    );
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let hash = if slot == "router" {
        let router = &answer["router"];
        router["variants"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == variant.as_str()))
            .or_else(|| Some(&router["shadow"]).filter(|s| s["name"] == variant.as_str()))
            .and_then(|v| v["hash"].as_str())
    } else {
        let key = if slot == "admission" {
            "admission"
        } else {
            "safety_filter"
        };
        answer[key]["policy"]["hash"].as_str()
    }
    .unwrap_or("?");
    let revision = answer["revision"].as_u64();
    let reach = match (revision, *wait) {
        (Some(revision), true) => {
            let timeout = std::time::Duration::from_secs(*wait_timeout);
            let replicas =
                runtime.block_on(applied_by_all(&client, base, token, revision, timeout))?;
            format!(
                " (revision {revision}, applied by every live replica: {})",
                replicas.join(", ")
            )
        }
        (Some(revision), false) => format!(" (revision {revision})"),
        (None, true) => " (applied: the gateway runs alone)".to_owned(),
        (None, false) => String::new(),
    };
    let variant = if slot == "router" { variant } else { slot };
    #[allow(clippy::print_stdout)]
    {
        println!(
            "{variant}: {} version {hash}{reach}",
            if answer["changed"] == false {
                "already runs"
            } else {
                "now runs"
            }
        );
    }
    Ok(())
}

/// Waits until every live replica `GET /admin/cluster` lists has applied `revision`, and
/// names them; past `timeout`, an error naming the ones behind and where they are. A replica
/// that dies leaves the list when its lease lapses, as the gateway's own `?wait=true` counts.
async fn applied_by_all(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    revision: u64,
    timeout: std::time::Duration,
) -> anyhow::Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let cluster: serde_json::Value = client
            .get(format!("{base}/admin/cluster"))
            .bearer_auth(token)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .context("reading the cluster's replicas (/admin/cluster)")?
            .json()
            .await
            .context("reading the cluster's replicas (/admin/cluster)")?;
        let replicas = cluster["replicas"].as_array().cloned().unwrap_or_default();
        let name = |r: &serde_json::Value| r["replica"].as_str().unwrap_or("?").to_owned();
        let behind: Vec<String> = replicas
            .iter()
            .filter(|r| r["applied_revision"].as_u64().is_none_or(|a| a < revision))
            .map(|r| format!("{} (at {})", name(r), r["applied_revision"]))
            .collect();
        if behind.is_empty() {
            return Ok(replicas.iter().map(name).collect());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "revision {revision} is not applied everywhere after {} s: {} behind; they apply it \
             when they catch up",
            timeout.as_secs(),
            behind.join(", ")
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// For `check-config`: loads every policy component the config names by file, as `serve`
/// would, and checks it is of its slot's world. By source, what each one is
/// (`router component, ringmaster:policy@0.3.0`); an error names the slot and the file.
pub fn check_config_components(
    policies: &ringmaster_config::PoliciesConfig,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    use ringmaster_config::PolicySource;
    let mut files: Vec<(&str, &[&str], &Path)> = Vec::new();
    for variant in &policies.router {
        if let PolicySource::File(path) = &variant.source {
            files.push(("router", &["router", "learning-router"], path));
        }
    }
    for (slot, spec, worlds) in [
        ("admission", &policies.admission, &["admission"][..]),
        ("safety", &policies.safety, &["safety-filter"][..]),
    ] {
        if let Some(ringmaster_config::SlotPolicySpec {
            source: PolicySource::File(path),
            ..
        }) = spec
        {
            files.push((slot, worlds, path));
        }
    }
    let mut found = std::collections::BTreeMap::new();
    if files.is_empty() {
        return Ok(found);
    }
    let scratch =
        std::env::temp_dir().join(format!("ringmaster-check-config-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("cannot create {}", scratch.display()))?;
    let result = (|| {
        for (slot, worlds, path) in files {
            let report = check::check(path, &scratch).with_context(|| {
                format!("the {slot} policy {} cannot be loaded", path.display())
            })?;
            anyhow::ensure!(
                worlds.contains(&report.world),
                "the {slot} policy {} is a {} component, not {}",
                path.display(),
                report.world,
                worlds.join(" or ")
            );
            found.insert(
                path.display().to_string(),
                format!(
                    "{} component, ringmaster:policy@{}",
                    report.world, report.contract
                ),
            );
        }
        Ok(found)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}
