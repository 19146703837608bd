//! The configuration's validation: what each section accepts, refuses, and says.

use std::num::NonZeroU32;

use super::*;
use crate::model::gpu_placement;

#[test]
fn the_model_device_is_the_cpu_or_a_cuda_ordinal() {
    let parse = |device: &str| {
        gpu_placement(&RawModel {
            device: Some(device.to_owned()),
            kv_blocks: Some(100),
            ..RawModel::default()
        })
    };
    assert_eq!(parse("cpu").unwrap(), None);
    assert_eq!(gpu_placement(&RawModel::default()).unwrap(), None);
    if cfg!(feature = "cuda") {
        assert_eq!(
            parse("cuda:1").unwrap(),
            Some(GpuPlacement {
                ordinal: 1,
                kv_blocks: Some(100)
            })
        );
        assert_eq!(parse("cuda").unwrap().map(|g| g.ordinal), Some(0));
    } else {
        let err = parse("cuda:1").unwrap_err().to_string();
        assert!(err.contains("--features cuda"), "{err}");
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn embedded_default_is_four_simulated_servers_on_loopback() {
    let config = RawConfig::embedded_default()
        .validate_with_env(no_env)
        .unwrap();
    assert_eq!(config.servers.len(), 4);
    assert!(config.listen.ip().is_loopback());
    assert_eq!(config.listen.port(), 8080);
    assert!(config.admin_tokens.is_empty());
    assert_eq!(config.policies.router.len(), 1);
    assert_eq!(
        config.policies.router[0].source,
        PolicySource::Builtin("prefix-affinity".into())
    );
    assert!(config.warnings.is_empty());
}

#[test]
fn the_router_slots_bounded_load_guard_is_explicit() {
    let guard = |policies: &str| {
        RawConfig::from_toml(&format!("[policies]\n{policies}"))
            .unwrap()
            .validate_with_env(no_env)
            .map(|c| c.policies.router_guard)
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        guard(""),
        Ok(CapGuard::Policy),
        "the policy decides by default"
    );
    assert_eq!(
        guard("router_bounded_load = \"host\""),
        Ok(CapGuard::Host { load_factor: None })
    );
    assert_eq!(
        guard("router_load_factor = 2.0"),
        Ok(CapGuard::Host {
            load_factor: Some(2.0)
        })
    );
    assert_eq!(
        guard("router_bounded_load = \"policy\""),
        Ok(CapGuard::Policy)
    );
    let err = guard("router_bounded_load = \"nobody\"").unwrap_err();
    assert!(err.contains("router_bounded_load"), "{err}");
    let err = guard("router_load_factor = 0.5").unwrap_err();
    assert!(err.contains("at least 1.0"), "{err}");
    let err = guard("router_bounded_load = \"policy\"\nrouter_load_factor = 2.0").unwrap_err();
    assert!(err.contains("no effect"), "{err}");
}

#[test]
fn refuses_public_listen_without_keys() {
    let raw = RawConfig::from_toml("listen = \"0.0.0.0:8080\"").unwrap();
    let err = raw.validate_with_env(no_env).unwrap_err().to_string();
    assert!(err.contains("without API keys"), "{err}");
    let raw =
        RawConfig::from_toml("listen = \"0.0.0.0:8080\"\n[[api_keys]]\nkey = \"sk-test-123456\"")
            .unwrap();
    assert!(raw.validate_with_env(no_env).is_ok());
}

#[test]
fn tls_needs_both_files_and_the_admin_listener_its_address() {
    let check = |toml: &str| {
        RawConfig::from_toml(toml)
            .unwrap()
            .validate_with_env(no_env)
    };
    let config = check("[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nclient_ca = \"ca.pem\"").unwrap();
    let tls = config.tls.unwrap();
    assert_eq!(tls.cert, std::path::PathBuf::from("c.pem"));
    assert_eq!(tls.client_ca, Some(std::path::PathBuf::from("ca.pem")));
    assert!(config.admin_listener.is_none());
    for (toml, key) in [
        ("[tls]\ncert = \"c.pem\"", "tls.key"),
        ("[tls]\nkey = \"k.pem\"", "tls.cert"),
        ("[tls]\nclient_ca = \"ca.pem\"", "tls.client_ca"),
        ("[admin]\ncert = \"c.pem\"\nkey = \"k.pem\"", "admin.cert"),
        ("[admin]\nlisten = \"nowhere\"", "admin.listen"),
    ] {
        let err = check(toml).unwrap_err().to_string();
        assert!(err.contains(key), "{toml}: {err}");
    }
    let config =
        check("[admin]\nlisten = \"127.0.0.1:9090\"\ncert = \"a.pem\"\nkey = \"b.pem\"").unwrap();
    let admin = config.admin_listener.unwrap();
    assert_eq!(admin.listen.port(), 9090);
    assert_eq!(admin.tls.unwrap().key, std::path::PathBuf::from("b.pem"));
    assert!(config.tls.is_none(), "the public listener stays plain");
}

#[test]
fn operator_tokens_are_named_digests_with_known_scopes() {
    let check = |toml: &str| {
        RawConfig::from_toml(&format!(
            "admin_token = \"the-full-admin-token-01\"\n{toml}"
        ))
        .unwrap()
        .validate_with_env(no_env)
    };
    let config = check(
        "[[admin.tokens]]\nname = \"ci\"\ntoken = \"ci-token-0123456789\"\nscopes = [\"policies\", \"read\"]",
    )
    .unwrap();
    let names: Vec<(&str, Vec<Scope>)> = config
        .admin_tokens
        .iter()
        .map(|t| (t.name.as_str(), t.scopes.clone()))
        .collect();
    assert_eq!(
        names,
        [
            ("admin", Scope::ALL.to_vec()),
            ("ci", vec![Scope::Read, Scope::Policies])
        ]
    );
    assert_eq!(
        config.admin_tokens[1].digest,
        key_digest("ci-token-0123456789")
    );
    for (toml, key) in [
        (
            "[[admin.tokens]]\ntoken = \"ci-token-0123456789\"",
            "admin.tokens[0].name",
        ),
        (
            "[[admin.tokens]]\nname = \"ci\"\ntoken = \"short\"",
            "admin.tokens[0].token",
        ),
        (
            "[[admin.tokens]]\nname = \"ci\"\ntoken = \"ci-token-0123456789\"\nscopes = [\"root\"]",
            "admin.tokens[0].scopes",
        ),
        (
            "[[admin.tokens]]\nname = \"admin\"\ntoken = \"ci-token-0123456789\"",
            "admin.tokens",
        ),
        (
            "[[admin.tokens]]\nname = \"ci\"\ntoken = \"the-full-admin-token-01\"",
            "admin.tokens",
        ),
        (
            "[[admin.tokens]]\nname = \"a\"\ntoken = \"ci-token-0123456789\"\n[[admin.tokens]]\nname = \"a\"\ntoken = \"ci-token-9876543210\"",
            "admin.tokens[1].name",
        ),
    ] {
        let err = check(toml).unwrap_err().to_string();
        assert!(err.contains(key), "{toml}: {err}");
    }
}

#[test]
fn keys_are_kept_as_digests_and_tenants_must_exist() {
    let digest = key_digest("sk-test-123456");
    let hex_digest: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let config = RawConfig::from_toml(&format!(
        "[[tenants]]\nname = \"acme\"\ninput_tokens_per_minute = 1000\n\
         [[api_keys]]\nkey_sha256 = \"{hex_digest}\"\ntenant = \"acme\"\nmodels = [\"m\"]"
    ))
    .unwrap()
    .validate_with_env(no_env)
    .unwrap();
    assert_eq!(config.api_keys[0].digest, digest);
    assert_eq!(config.api_keys[0].tenant.as_deref(), Some("acme"));
    assert_eq!(
        config.tenants[0].limits.input_tokens_per_minute,
        NonZeroU32::new(1000)
    );
    for (toml, field) in [
        (
            "[[api_keys]]\nkey = \"sk-test-123456\"\ntenant = \"nobody\"",
            "api_keys[0].tenant",
        ),
        (
            "[[api_keys]]\nkey_sha256 = \"abc\"",
            "api_keys[0].key_sha256",
        ),
        (
            "[[api_keys]]\nkey = \"sk-test-123456\"\nkey_sha256 = \"00\"",
            "not both",
        ),
        ("[[api_keys]]\ntier = \"gold\"", "api_keys[0].key"),
        (
            "[[api_keys]]\nkey = \"sk-test-123456\"\noutput_tokens_per_minute = 0",
            "output_tokens_per_minute",
        ),
        (
            "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"a\"",
            "duplicate tenant",
        ),
        (
            "[autoscale]\nscale_up = 0.1\nscale_down = 0.5",
            "scale_down",
        ),
        ("[limits]\nstream_ping_ms = 9999999", "stream_ping_ms"),
        ("[limits]\nmax_header_bytes = 100", "max_header_bytes"),
        ("[limits]\nmax_headers = 2", "max_headers"),
        (
            "[limits]\nmax_concurrent_streams = 0",
            "max_concurrent_streams",
        ),
        ("[limits]\nmax_memory_mb = 10", "max_memory_mb"),
        (
            "[limits]\nidle_timeout_ms = 999999999999",
            "idle_timeout_ms",
        ),
    ] {
        let err = RawConfig::from_toml(toml)
            .unwrap()
            .validate_with_env(no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{toml}: {err}");
    }
}

#[test]
fn admin_token_comes_from_env_when_file_has_none() {
    let config = RawConfig::default()
        .validate_with_env(|n| (n == ADMIN_TOKEN_ENV).then(|| "a".repeat(20)))
        .unwrap();
    // Kept as the digest of the token named "admin", with every scope; never in the clear.
    assert_eq!(config.admin_tokens.len(), 1);
    assert_eq!(config.admin_tokens[0].name, "admin");
    assert_eq!(config.admin_tokens[0].digest, key_digest(&"a".repeat(20)));
    assert!(!format!("{config:?}").contains(&"a".repeat(20)));
    // A short token names where it came from: the variable (there is no key to fix), or
    // the file's key.
    let err = RawConfig::default()
        .validate_with_env(|_| Some("short".into()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("environment variable RINGMASTER_ADMIN_TOKEN") && !err.contains("admin_token"),
        "{err}"
    );
    assert!(
        err.contains("at least 16 characters, and this one has 5"),
        "{err}"
    );
    let err = RawConfig::from_toml("admin_token = \"short\"")
        .unwrap()
        .validate_with_env(|_| Some("a".repeat(20)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config key `admin_token`") && !err.contains("RINGMASTER"),
        "{err}"
    );
}

/// A configuration error's words appear once down its chain of causes: anyhow's `{:#}` and
/// `Caused by:` print each cause after the message, so a message that holds its cause's
/// words must not expose it as a source too (a TOML error's snippet was printed twice).
#[test]
fn an_error_says_each_thing_once_down_its_chain() {
    let chain = |err: &ConfigError| {
        let mut text = err.to_string();
        let mut cause = std::error::Error::source(err);
        while let Some(e) = cause {
            text.push_str(&format!(": {e}"));
            cause = e.source();
        }
        text
    };
    let parse = RawConfig::from_toml("listen = \"127.0.0.1:8080\"\nbogus_key = 1\n").unwrap_err();
    let text = chain(&parse);
    assert_eq!(text.matches("bogus_key = 1").count(), 1, "{text}");
    assert!(text.contains("unknown field"), "{text}");
    let read = RawConfig::from_file(Path::new("/nonexistent/ringmaster.toml")).unwrap_err();
    let text = chain(&read);
    assert_eq!(text.matches("No such file").count(), 1, "{text}");
}

/// A built-in policy fills one slot: named in another's place it is refused by the
/// configuration's own check, which `check-config` and `serve` both run (`check-config` once
/// passed `router = "builtin:tiered"`, which `serve` refused when the engine loaded it).
#[test]
fn a_built_in_in_another_slots_place_is_refused() {
    let check = |toml: &str| {
        RawConfig::from_toml(toml)
            .unwrap()
            .validate_with_env(no_env)
            .map(drop)
            .map_err(|e| e.to_string())
    };
    for (toml, key) in [
        ("[routing]\nrouter = \"builtin:tiered\"", "routing.router"),
        (
            "[[policies.router]]\nname = \"a\"\nsource = \"builtin:blocklist\"",
            "policies.router[0].source",
        ),
        (
            "[policies.admission]\nsource = \"builtin:round-robin\"",
            "policies.admission.source",
        ),
        (
            "[policies.safety]\nsource = \"builtin:tiered\"",
            "policies.safety.source",
        ),
    ] {
        let err = check(toml).unwrap_err();
        assert!(err.contains(key) && err.contains("slot"), "{toml}: {err}");
    }
    let err = check("[routing]\nrouter = \"builtin:tiered\"").unwrap_err();
    assert!(
        err.contains("builtin:tiered fills the admission slot, not the router slot")
            && err.contains("prefix-affinity")
            && !err.contains("blocklist"),
        "{err}"
    );
    // Each in its own slot passes.
    check(
        "[routing]\nrouter = \"builtin:learned-ttft\"\n\
         [policies.admission]\nsource = \"builtin:tiered\"\n\
         [policies.safety]\nsource = \"builtin:blocklist\"",
    )
    .unwrap();
}

/// The embedded default configuration points its reader at a section of the documentation
/// by file and title (`(docs/policies.md, "Which default, and why")`): the file exists and
/// holds the title, so the pointer cannot go stale when a section moves again.
#[test]
fn the_default_configurations_pointers_name_sections_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut pointers = 0;
    for part in DEFAULT_CONFIG_TOML.split('(').skip(1) {
        let Some((file, rest)) = part.split_once(", \"") else {
            continue;
        };
        if !(file == "README" || file.ends_with(".md")) || file.contains(char::is_whitespace) {
            continue;
        }
        let Some((title, _)) = rest.split_once('"') else {
            continue;
        };
        let path = match file {
            "README" => root.join("README.md"),
            other => root.join(other),
        };
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the default config points at {file}: {e}"));
        assert!(
            text.contains(title),
            "the default config points at {file}, {title:?}, which it does not hold"
        );
        pointers += 1;
    }
    assert!(pointers >= 1, "the default config points at no section");
}

#[test]
fn errors_name_the_key() {
    let cases = [
        ("listen = \"nowhere\"", "listen"),
        ("bogus = 1", "unknown field"),
        ("[routing]\nstrategy = \"random\"", "routing.strategy"),
        ("[routing]\nrouter = \"builtin:nope\"", "routing.router"),
        (
            "[routing]\nrouter = \"builtin:round-robin\"\n[[policies.router]]\nname = \"a\"\nsource = \"builtin:least-loaded\"",
            "give one of them",
        ),
        ("[routing]\nload_factor = 0.5", "routing"),
        (
            "[[servers]]\naddress = \"http://10.0.0.1\"",
            "http://HOST:PORT",
        ),
        (
            "[[servers]]\naddress = \"https://10.0.0.1:9000/v1\"",
            "no path",
        ),
        (
            "[[servers]]\naddress = \"http://10.0.0.1:9000\"\nca_file = \"ca.pem\"",
            "TLS files need an https:// address",
        ),
        (
            "[[servers]]\naddress = \"https://10.0.0.1\"\nclient_cert = \"c.pem\"",
            "client_cert and client_key go together",
        ),
        (
            "[[servers]]\naddress = \"https://10.0.0.1\"\napi_key_env = \"RINGMASTER_TEST_UNSET_KEY\"",
            "\"RINGMASTER_TEST_UNSET_KEY\" is not set",
        ),
        (
            "[[servers]]\naddress = \"https://10.0.0.1\"\nheaders = { host = \"x\" }",
            "not a header name",
        ),
        (
            "[[servers]]\naddress = \"sim://a\"\napi_key_env = \"K\"",
            "describe a remote server",
        ),
        ("[[fallback]]\npool = \"a b\"", "fallback[0]"),
        (
            "[cluster]\nurl = \"redis://10.0.0.1:6379/0\"\nca_file = \"ca.pem\"",
            "need a rediss:// url",
        ),
        (
            "[cluster]\nurl = \"rediss://10.0.0.1:6379/0\"\nclient_key = \"k.pem\"",
            "go together",
        ),
        (
            "[[fallback]]\npool = \"hosted\"\nwhen = [\"sometimes\"]",
            "fallback[0].when",
        ),
        (
            "[[fallback]]\npool = \"hosted\"\nmodels = []",
            "fallback[0].models",
        ),
        (
            "[[servers]]\naddress = \"http://10.0.0.1:80\"\npool = \"hosted\"\nrole = \"prefill\"\ndisaggregation = \"vllm-nixl\"",
            "spill-over pool",
        ),
        (
            "[[servers]]\naddress = \"sim://a\"\n[[servers]]\naddress = \"sim://a\"",
            "duplicate id",
        ),
        ("[[servers]]\naddress = \"sim://a\"\nweight = 0", "weight"),
        (
            "[simulator]\ndecode_step_base_ms = -1",
            "decode_step_base_ms",
        ),
        ("models = []", "models"),
        ("[model]\nthreads = 0", "model.threads"),
        ("[model]\nkernels = \"neon\"", "model.kernels"),
        ("[model]\nkv_blocks = 0", "model.kv_blocks"),
        ("[model]\ndevice = \"tpu:0\"", "model.device"),
        ("[model]\ndevice = \"cuda:x\"", "model.device"),
        (
            "[policies.admission]\nsource = \"builtin:nope\"",
            "policies.admission.source",
        ),
        (
            "[policies.admission]\nsource = \"builtin:tiered\"\nqueue_timeout_ms = 0",
            "policies.admission.queue_timeout_ms",
        ),
        (
            "[policies.safety]\nsource = \"builtin:blocklist\"\nwindow_bytes = 1",
            "policies.safety.window_bytes",
        ),
        ("[policies.safety]\nsource = \"\"", "policies.safety.source"),
        (
            "[policies]\npass_headers = [\"bad header\"]",
            "pass_headers[0]",
        ),
    ];
    for (toml, needle) in cases {
        let err = RawConfig::from_toml(toml)
            .and_then(|raw| raw.validate_with_env(no_env))
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{toml}: {err}");
    }
}

#[test]
fn slots_and_their_settings_are_read() {
    let config = RawConfig::from_toml(
        "[policies]\npass_headers = [\"X-Team\"]\n\
         [policies.admission]\nsource = \"builtin:tiered\"\nqueue_capacity = 8\n\
         queue_timeout_ms = 250\nconfig = { \"priority.gold\" = 200 }\n\
         [policies.safety]\nsource = \"/etc/ringmaster/filter.wasm\"\nwindow_bytes = 64\n\
         fail_closed = true",
    )
    .unwrap()
    .validate_with_env(no_env)
    .unwrap();
    let policies = &config.policies;
    let admission = policies.admission.as_ref().unwrap();
    assert_eq!(admission.name, "admission");
    assert_eq!(admission.source, PolicySource::Builtin("tiered".into()));
    assert_eq!(admission.config["priority.gold"], "200");
    assert_eq!(policies.queue_capacity, 8);
    assert_eq!(policies.queue_timeout, Duration::from_millis(250));
    assert_eq!(policies.safety_window_bytes, 64);
    assert!(policies.safety_fail_closed);
    assert_eq!(policies.pass_headers, ["x-team"]);
    let files = policies.files();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, "safety-filter");
}

/// Every example configuration and the README's annotated one validate.
#[test]
fn example_configurations_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("examples/configs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            RawConfig::from_toml(&text)
                .and_then(|raw| raw.validate_with_env(no_env))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            checked += 1;
        }
    }
    assert!(checked >= 2);
    let reference = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    // The annotated configuration is the reference's first TOML block.
    let block = reference
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/configuration.md has a TOML block");
    // Its listen address is public, which needs API keys: it has one.
    RawConfig::from_toml(block)
        .and_then(|raw| raw.validate_with_env(no_env))
        .unwrap_or_else(|e| panic!("docs/configuration.md: {e}"));
}

/// `[routing] strategy` named the routing choice before routers were policies: it still
/// reads, as the router policy it always was, and says so.
#[test]
fn the_deprecated_strategy_names_a_router() {
    let config = |toml: &str| {
        RawConfig::from_toml(toml)
            .unwrap()
            .validate_with_env(no_env)
            .unwrap()
    };
    let round_robin = config("[routing]\nstrategy = \"round-robin\"");
    assert_eq!(
        round_robin.policies.router[0].source,
        PolicySource::Builtin("round-robin".into())
    );
    assert!(round_robin.warnings[0].contains("routing.router"));
    let ring = config("[routing]\nrouter = \"builtin:consistent-hash\"");
    assert_eq!(
        ring.policies.router[0].source,
        PolicySource::Builtin("consistent-hash".into())
    );
    assert!(ring.warnings.is_empty());
}

#[test]
fn client_limits_have_production_defaults_and_zero_turns_each_off() {
    use crate::limits::{Bound, ClientLimits};
    let config = RawConfig::default().validate_with_env(no_env).unwrap();
    assert_eq!(config.client, ClientLimits::default());
    assert_eq!(
        config.client.header_read_timeout,
        Some(std::time::Duration::from_secs(10))
    );
    assert_eq!(config.client.max_connections, Bound::Auto);
    let config = RawConfig::from_toml(
        "[limits]\nheader_read_timeout_ms = 0\nidle_timeout_ms = 0\nbody_read_timeout_ms = 0\n\
         max_connections = 0\nmax_pending_requests = 0\nmax_memory_mb = 0",
    )
    .unwrap()
    .validate_with_env(no_env)
    .unwrap();
    let off = config.client;
    assert_eq!(
        (
            off.header_read_timeout,
            off.idle_timeout,
            off.body_read_timeout
        ),
        (None, None, None)
    );
    assert_eq!(off.max_connections, Bound::Off);
    assert_eq!(off.max_pending_requests, None);
    assert_eq!(off.max_memory_bytes, Bound::Off);
    let config = RawConfig::from_toml(
        "[limits]\nmax_connections = 50\nmax_memory_mb = 512\nmax_concurrent_streams = 4",
    )
    .unwrap()
    .validate_with_env(no_env)
    .unwrap();
    assert_eq!(config.client.max_connections, Bound::At(50));
    assert_eq!(config.client.max_memory_bytes, Bound::At(512 << 20));
    assert_eq!(config.client.max_concurrent_streams, 4);
    assert_eq!(Bound::At(3).resolve(|| 9), Some(3));
    assert_eq!(Bound::Auto.resolve(|| 9), Some(9));
    assert_eq!(Bound::<u32>::Off.resolve(|| 9), None);
}

/// The tables and keys the configuration accepts, as its deserializer lists them: a table
/// given an unknown key is refused with every name it would take ("unknown field `…`,
/// expected one of …"). Returns `None` for a table that takes any key (a policy's `config`).
fn keys_of(header: &str) -> Option<Vec<String>> {
    const PROBE: &str = "zz_probe";
    let text = format!("{header}\n{PROBE} = 1\n");
    let error = RawConfig::from_toml(&text).err()?.to_string();
    let rest = error
        .split(&format!("unknown field `{PROBE}`, expected"))
        .nth(1)?;
    let line = rest.lines().next().unwrap_or_default();
    Some(
        line.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every key the configuration accepts, dotted: `[]` marks an array of tables
/// (`servers[].address`), `NAME` a table of tables named by the user
/// (`lora.adapters.NAME.path`).
fn accepted_keys() -> std::collections::BTreeSet<String> {
    fn walk(path: &str, header: &str, into: &mut std::collections::BTreeSet<String>) {
        let keys = keys_of(header).unwrap_or_else(|| panic!("{header:?} names no table"));
        for key in keys {
            let dotted = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let name = |p: &str| p.replace("[]", "");
            if keys_of(&format!("[{}]", name(&dotted))).is_some() {
                walk(&dotted, &format!("[{}]", name(&dotted)), into);
            } else if keys_of(&format!("[[{}]]", name(&dotted))).is_some() {
                walk(
                    &format!("{dotted}[]"),
                    &format!("[[{}]]", name(&dotted)),
                    into,
                );
            } else if keys_of(&format!("[{}.NAME]", name(&dotted))).is_some() {
                walk(
                    &format!("{dotted}.NAME"),
                    &format!("[{}.NAME]", name(&dotted)),
                    into,
                );
            } else {
                into.insert(dotted);
            }
        }
    }
    let mut keys = std::collections::BTreeSet::new();
    walk("", "", &mut keys);
    keys
}

/// docs/configuration.md's reference table lists every key the configuration accepts, and
/// nothing it does not: a new key fails here until it is documented, a removed one until its
/// row goes.
#[test]
fn the_reference_documents_every_key_and_only_those() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let reference = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    let table = reference
        .split("## Every key")
        .nth(1)
        .expect("docs/configuration.md has a section \"Every key\"");
    let documented: std::collections::BTreeSet<String> = table
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect();
    let accepted = accepted_keys();
    assert!(accepted.len() > 100, "{accepted:?}");
    assert!(accepted.contains("servers[].address") && accepted.contains("lora.adapters.NAME.base"));
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let gone: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && gone.is_empty(),
        "docs/configuration.md, \"Every key\": document {undocumented:?}; remove {gone:?}"
    );
}

#[test]
fn remote_ringmaster_pairs_need_the_workers_secret_from_the_environment() {
    let pair = |extra: &str| {
        format!(
            "{extra}\n[[servers]]\nid = \"p\"\naddress = \"http://10.0.0.1:8001\"\nrole = \"prefill\"\n\
             disaggregation = \"ringmaster\"\n[[servers]]\nid = \"d\"\naddress = \"http://10.0.0.2:8001\"\n\
             role = \"decode\"\ndisaggregation = \"ringmaster\"\n"
        )
    };
    let err = RawConfig::from_toml(&pair(""))
        .unwrap()
        .validate_with_env(no_env)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("workers.secret_env") && err.contains("RINGMASTER_WORKER_SECRET"),
        "{err}"
    );
    let short = |name: &str| (name == "RINGMASTER_WORKER_SECRET").then(|| "short".to_owned());
    let err = RawConfig::from_toml(&pair(""))
        .unwrap()
        .validate_with_env(short)
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least 16"), "{err}");
    // Another variable, named in the file; the secret is carried redacted.
    let named = |name: &str| (name == "FLEET_SECRET").then(|| "0123456789abcdef-fleet".to_owned());
    let config = RawConfig::from_toml(&pair("[workers]\nsecret_env = \"FLEET_SECRET\""))
        .unwrap()
        .validate_with_env(named)
        .unwrap();
    assert_eq!(config.workers.secret_env, "FLEET_SECRET");
    assert_eq!(
        config.workers.secret.as_ref().map(Secret::expose),
        Some("0123456789abcdef-fleet")
    );
    assert!(!format!("{config:?}").contains("0123456789abcdef-fleet"));
    // This process's own servers hand their blocks over in memory: no secret needed.
    let local = "[[servers]]\naddress = \"sim://p\"\nrole = \"prefill\"\n\
                 [[servers]]\naddress = \"sim://d\"\nrole = \"decode\"\n";
    assert!(
        RawConfig::from_toml(local)
            .unwrap()
            .validate_with_env(no_env)
            .is_ok()
    );
}
