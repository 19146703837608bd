//! Faults on the network between the gateway and its servers, made with the tests' own network
//! namespaces: each server (the fake OpenAI server, a process) runs in a namespace of its own,
//! joined to this one by a veth pair on a private /30, so its link can be cut mid-stream,
//! shaped, made lossy (iptables' `statistic` match: this kernel has no netem) and restored,
//! and the server itself killed, hung (SIGSTOP), slowed or flapped. Every request must end in
//! a response or a well-formed error (a JSON error body, or an SSE `error` event that ends the
//! stream), and the health view must converge once the fault is gone.
//!
//! These need root, `ip` and `tc` (iproute2), `nsenter` (util-linux) and `iptables-legacy`; `tests/run` runs as root
//! and sets `RINGMASTER_REQUIRE_NETNS`, which makes a missing piece a failure, not a skip.
//! Everything stays on this machine and each namespace is removed when its test ends.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{TestGateway, eventually};

/// Whether this machine can make, shape and enter namespaces (root, iproute2, util-linux's
/// nsenter, iptables-legacy): tried once for real, a namespace made, a link set up in it and a
/// program run inside, since having the tools is not having the right (a container without
/// CAP_SYS_ADMIN). A missing piece fails the test under `RINGMASTER_REQUIRE_NETNS=1`, else
/// skips it with a note saying which.
fn netns_available() -> bool {
    static FOUND: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let works = |cmd: &str, args: &[&str]| {
            Command::new(cmd)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        });
        if !root {
            return Err("they need root".into());
        }
        for (cmd, args) in [
            ("ip", &["netns", "list"][..]),
            ("nsenter", &["--version"]),
            ("tc", &["-V"]),
            ("iptables-legacy", &["--version"]),
        ] {
            if !works(cmd, args) {
                return Err(format!("`{cmd}` is missing"));
            }
        }
        let probe = format!("rmf-probe-{}", std::process::id());
        let made = works("ip", &["netns", "add", &probe]);
        let entered = made
            && works("ip", &["-n", &probe, "link", "set", "lo", "up"])
            && works("nsenter", &[&format!("--net=/run/netns/{probe}"), "true"]);
        if made {
            let _ = works("ip", &["netns", "del", &probe]);
        }
        match (made, entered) {
            (false, _) => Err("`ip netns add` is refused here".into()),
            (true, false) => Err("a namespace is made but cannot be entered".into()),
            (true, true) => Ok(()),
        }
    });
    if let Err(why) = found {
        assert!(
            std::env::var("RINGMASTER_REQUIRE_NETNS").as_deref() != Ok("1"),
            "RINGMASTER_REQUIRE_NETNS=1 but the network-fault tests cannot run here: {why}"
        );
        eprintln!("skipping the network-fault tests: {why}");
    }
    found.is_ok()
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .expect("the command runs");
    assert!(
        out.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The output of a command, or an empty string where it could not run.
fn output(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Claims a lab number no live test process holds, across processes (nextest runs each test
/// in its own) as well as threads: an exclusive lock on a file per number, which the kernel
/// releases when its holder ends however it ends, so a crashed run never keeps a number.
fn claim_lab() -> (u32, std::fs::File) {
    let dir = std::path::Path::new("/run/ringmaster-netfaults");
    std::fs::create_dir_all(dir).expect("the lab lock folder can be made");
    for k in 1..250 {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{k}.lock")))
            .expect("a lab lock file opens");
        if file.try_lock().is_ok() {
            return (k, file);
        }
    }
    panic!("every lab number is held by a live test");
}

/// Clears whatever a run that is gone left at lab `k`: its namespace (and the processes in
/// it) and any link in this namespace holding an address of the lab's /30. A stale link's
/// route for the same /30 would otherwise win over the new one and carry its packets to a
/// dead end (seen: a killed run left two, and the next run's servers "did not listen").
fn clear_lab(k: u32, ns: &str) {
    for pid in output("ip", &["netns", "pids", ns]).split_whitespace() {
        let _ = Command::new("kill").args(["-KILL", pid]).status();
    }
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
    let prefix = format!("10.213.{k}.0/30");
    for line in output("ip", &["-o", "-4", "addr", "show", "to", &prefix]).lines() {
        if let Some(name) = line.split_whitespace().nth(1) {
            let name = name.split('@').next().unwrap_or(name);
            let _ = Command::new("ip").args(["link", "del", name]).status();
        }
    }
}

/// One server behind its own link.
struct Linked {
    ns: String,
    host_if: String,
    ns_if: String,
    addr: String,
    server: Option<Child>,
    /// Where the server's stderr goes, for the message when it does not come up.
    log: std::path::PathBuf,
    /// Held for the lab's life: the number is this test's until it is dropped.
    _claim: std::fs::File,
}

impl Linked {
    /// A namespace, its veth link, and the fake server in it (`behavior`, `tokens` a stream).
    fn start(behavior: &str, tokens: usize) -> Self {
        let (k, claim) = claim_lab();
        let ns = format!("rmf-{k}");
        // Interface names are at most 15 bytes.
        let (host_if, ns_if) = (format!("rmfh{k}"), format!("rmfn{k}"));
        let (host_ip, ns_ip) = (format!("10.213.{k}.1"), format!("10.213.{k}.2"));
        clear_lab(k, &ns);
        let log = std::env::temp_dir().join(format!(
            "ringmaster-netfaults-{}-{k}.log",
            std::process::id()
        ));
        // Made before the lab is built, so that a step that fails still drops it: its Drop
        // removes the namespace and the link whatever state they reached.
        let mut linked = Self {
            ns,
            host_if,
            ns_if,
            addr: format!("{ns_ip}:8000"),
            server: None,
            log,
            _claim: claim,
        };
        let (ns, host_if, ns_if) = (&linked.ns, &linked.host_if, &linked.ns_if);
        // Whatever happens to a link, nothing for these addresses leaves this machine: with a
        // link's own route gone, the default route would carry its packets out.
        let _ = Command::new("ip")
            .args(["route", "add", "blackhole", "10.213.0.0/16"])
            .stderr(Stdio::null())
            .status();
        run("ip", &["netns", "add", ns]);
        run(
            "ip",
            &[
                "link", "add", host_if, "type", "veth", "peer", "name", ns_if,
            ],
        );
        run("ip", &["link", "set", ns_if, "netns", ns]);
        run(
            "ip",
            &["addr", "add", &format!("{host_ip}/30"), "dev", host_if],
        );
        run("ip", &["link", "set", host_if, "up"]);
        // `ip -n`, never `ip netns exec`: exec also remounts /sys in a mount namespace of its
        // own, which fails where / is not a mount point (a chroot: "mount --make-rslave /"
        // failed), and nothing here needs more than the network namespace.
        run("ip", &["-n", ns, "link", "set", "lo", "up"]);
        run(
            "ip",
            &[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ns_ip}/30"),
                "dev",
                ns_if,
            ],
        );
        run("ip", &["-n", ns, "link", "set", ns_if, "up"]);
        linked.spawn(behavior, tokens);
        linked
    }

    fn spawn(&mut self, behavior: &str, tokens: usize) {
        let stderr = std::fs::File::create(&self.log).expect("the server's log opens");
        let child = Command::new("nsenter")
            .arg(self.net())
            .arg(env!("CARGO_BIN_EXE_fake-upstream"))
            .args(["--listen", &self.addr, "--behavior", behavior])
            .args(["--tokens", &tokens.to_string()])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("the fake server starts");
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(
            &self.addr.parse().unwrap(),
            Duration::from_millis(200),
        )
        .is_err()
        {
            if Instant::now() >= deadline {
                let exited = self
                    .server
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                let ip = self.addr.split(':').next().unwrap_or_default();
                panic!(
                    "the server in {} did not listen on {} in 10 s; it {}; its stderr: {:?}; \
                     route: {:?}",
                    self.ns,
                    self.addr,
                    exited.map_or("still runs".to_string(), |s| format!("exited ({s})")),
                    std::fs::read_to_string(&self.log).unwrap_or_default(),
                    output("ip", &["route", "get", ip]).trim(),
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `nsenter`'s argument that enters this lab's network namespace (and nothing else).
    fn net(&self) -> String {
        format!("--net=/run/netns/{}", self.ns)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The link goes down at the server's end: packets are neither delivered nor refused.
    fn cut(&self) {
        self.link("down");
    }

    fn restore(&self) {
        self.link("up");
    }

    fn link(&self, state: &str) {
        run("ip", &["-n", &self.ns, "link", "set", &self.ns_if, state]);
    }

    /// Drops `percent` % of the packets arriving at the server, at random.
    fn lose(&self, percent: u32) {
        let p = format!("{:.2}", f64::from(percent) / 100.0);
        run(
            "nsenter",
            &[
                &self.net(),
                "iptables-legacy",
                "-A",
                "INPUT",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &p,
                "-j",
                "DROP",
            ],
        );
    }

    fn lossless(&self) {
        run("nsenter", &[&self.net(), "iptables-legacy", "-F", "INPUT"]);
    }

    /// A slow link both ways (a token bucket at `kbit` kbit/s: full frames wait in its queue).
    fn slow(&self, kbit: u32) {
        let rate = format!("{kbit}kbit");
        run(
            "tc",
            &[
                "qdisc",
                "add",
                "dev",
                &self.host_if,
                "root",
                "tbf",
                "rate",
                &rate,
                "burst",
                "1600",
                "latency",
                "2s",
            ],
        );
    }

    fn fast(&self) {
        run("tc", &["qdisc", "del", "dev", &self.host_if, "root"]);
    }

    /// Signals every process in the namespace (the server, and anything it started).
    fn signal(&self, signal: &str) {
        let pids = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill").args([signal, pid]).status();
        }
    }

    fn kill(&mut self) {
        self.signal("-KILL");
        if let Some(mut child) = self.server.take() {
            let _ = child.wait();
        }
    }
}

impl Drop for Linked {
    fn drop(&mut self) {
        self.kill();
        // Removing the namespace removes its end of the veth pair, and with it this end.
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A gateway in front of `servers`, with timeouts short enough for a test and an ejection that
/// ends soon after a fault does.
async fn gateway(servers: &[&Linked]) -> TestGateway {
    let mut toml = String::from(
        "models = [\"fake\"]\n[upstream]\nconnect_timeout_ms = 300\nfirst_byte_timeout_ms = 1500\n\
         chunk_gap_timeout_ms = 600\nwhole_answer_timeout_ms = 20000\n\
         eject_after_failures = 1\neject_base_ms = 300\neject_max_ms = 1000\n\
         [retry]\nattempts = 3\ndeadline_ms = 5000\n",
    );
    for (i, s) in servers.iter().enumerate() {
        toml.push_str(&format!(
            "[[servers]]\nid = \"gpu-{i}\"\naddress = \"{}\"\n",
            s.url()
        ));
    }
    TestGateway::start(&toml).await
}

fn body(stream: bool) -> Value {
    json!({"model": "fake", "max_tokens": 64, "stream": stream,
        "messages": [{"role": "user", "content": "tell me"}]})
}

/// How one request ended.
#[derive(Debug, PartialEq, Eq, Clone, Copy, Hash)]
enum Ending {
    /// A whole answer (a JSON message, or a stream through `message_stop`).
    Answer,
    /// A well-formed error: a JSON error object with a type, or a stream's `error` event.
    WellFormedError,
}

/// Sends one request and says how it ended; panics on anything else (a connection cut with no
/// answer, a stream that stops without `message_stop` or `error`, a body that is not JSON).
async fn ending(gw: &TestGateway, stream: bool) -> Ending {
    let response = gw
        .client
        .post(gw.url("/v1/messages"))
        .timeout(Duration::from_secs(30))
        .json(&body(stream))
        .send()
        .await
        .expect("the gateway answers");
    let status = response.status();
    let text = response.text().await.expect("the body ends cleanly");
    if status == 200 && !stream {
        let message: Value = serde_json::from_str(&text).expect("a JSON message");
        assert_eq!(message["type"], "message", "{text}");
        return Ending::Answer;
    }
    if status == 200 {
        let frames: Vec<&str> = text.split("\n\n").collect();
        let last = frames
            .iter()
            .rev()
            .find(|f| f.lines().any(|l| l.starts_with("event: ")))
            .copied()
            .unwrap_or("");
        if last.contains("event: message_stop") {
            return Ending::Answer;
        }
        assert!(
            last.contains("event: error") && last.contains("\"type\":\"error\""),
            "a stream must end in message_stop or an error event: {text}"
        );
        eprintln!("a well-formed error event: {last}");
        return Ending::WellFormedError;
    }
    eprintln!("a well-formed error ({status}): {text}");
    let error: Value = serde_json::from_str(&text).expect("an error body is JSON");
    assert_eq!(error["type"], "error", "{text}");
    assert!(error["error"]["type"].is_string(), "{text}");
    assert!(status.is_server_error(), "{status}: {text}");
    Ending::WellFormedError
}

/// Waits until every server is routable again and a request to each one's share succeeds.
async fn converged(gw: &TestGateway, servers: usize) {
    let healthy = eventually(Duration::from_secs(15), async || {
        let listed = gw.servers().await;
        let all = listed["servers"].as_array().cloned().unwrap_or_default();
        all.len() == servers && all.iter().all(|s| s["routable"] == true)
    })
    .await;
    assert!(
        healthy,
        "the health view did not converge: {}",
        gw.servers().await
    );
    for _ in 0..servers * 2 {
        assert_eq!(ending(gw, false).await, Ending::Answer);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_mid_stream_ends_in_an_error_event_and_health_recovers() {
    if !netns_available() {
        return;
    }
    let a = Linked::start("paced", 100);
    let b = Linked::start("paced", 100);
    let gw = gateway(&[&a, &b]).await;
    // A stream begins; its server's link is cut after some tokens.
    let response = gw
        .client
        .post(gw.url("/v1/messages"))
        .json(&body(true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let server = response.headers()["x-ringmaster-server"]
        .to_str()
        .unwrap()
        .to_owned();
    let cut = if server == "gpu-0" { &a } else { &b };
    let reading = tokio::spawn(async move { response.text().await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    cut.cut();
    let started = Instant::now();
    let text = reading.await.unwrap().expect("the stream ends cleanly");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stream hung {:?}",
        started.elapsed()
    );
    assert!(text.contains("content_block_delta"), "tokens came first");
    assert!(
        text.trim_end().ends_with('}') && text.contains("event: error"),
        "the cut stream ends in an error event: {text}"
    );
    // While the link is down, every request goes to the other server (the first to the cut
    // one times out on connect or first byte and is retried there).
    for stream in [false, true, false, true] {
        assert_eq!(ending(&gw, stream).await, Ending::Answer);
    }
    cut.restore();
    converged(&gw, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_a_slow_link_a_killed_a_hung_and_a_flapping_server_lose_no_request() {
    if !netns_available() {
        return;
    }
    let a = Linked::start("paced", 30);
    let mut b = Linked::start("paced", 30);
    let gw = gateway(&[&a, &b]).await;
    let mut outcomes = std::collections::BTreeMap::<&str, Vec<Ending>>::new();
    let mut phase = async |name: &'static str, gw: &TestGateway, n: usize| {
        for i in 0..n {
            outcomes
                .entry(name)
                .or_default()
                .push(ending(gw, i % 2 == 0).await);
        }
    };
    // 30 % of the packets to one server dropped: TCP retransmits, answers are late but whole.
    a.lose(30);
    phase("loss 30 %", &gw, 8).await;
    a.lossless();
    // A slow link to one server.
    a.slow(256);
    phase("slow link 256 kbit/s", &gw, 8).await;
    a.fast();
    // One server killed: its requests are refused at connect and retried on the other.
    b.kill();
    phase("server killed", &gw, 8).await;
    b.spawn("paced", 30);
    // One server hung (stopped, its sockets open): first-byte and chunk timeouts.
    a.signal("-STOP");
    phase("server hung", &gw, 8).await;
    a.signal("-CONT");
    // One link flapping: down and up every 300 ms for the phase.
    let flapping = {
        let (ns, ns_if) = (a.ns.clone(), a.ns_if.clone());
        std::thread::spawn(move || {
            let set = |state: &str| {
                let _ = Command::new("ip")
                    .args(["-n", &ns, "link", "set", &ns_if, state])
                    .status();
            };
            for i in 0..12 {
                set(if i % 2 == 0 { "down" } else { "up" });
                std::thread::sleep(Duration::from_millis(300));
            }
            set("up");
        })
    };
    phase("link flapping", &gw, 8).await;
    flapping.join().unwrap();
    eprintln!("outcomes by fault: {outcomes:?}");
    // Each fault touched one of two servers: the other answered, so none may be lost.
    for (fault, endings) in &outcomes {
        let answered = endings.iter().filter(|e| **e == Ending::Answer).count();
        assert!(
            answered * 2 >= endings.len(),
            "{fault}: only {answered} of {} answered",
            endings.len()
        );
    }
    converged(&gw, 2).await;
}
