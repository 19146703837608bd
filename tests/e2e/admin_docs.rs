//! The documentation's admin examples, run as written against a started gateway: every `curl`
//! line of `README.md` and `docs/*.md` that calls `/admin/` (with `sh`, so its variables,
//! quoting and `@file` uploads are the shell's), and every JSON body the endpoint table of
//! `docs/admin-api.md` shows, sent the way `curl -d` sends it. Each must answer what the docs
//! say: a success with a JSON body. The docs' `curl -d` lines name no content type, so curl
//! sends `application/x-www-form-urlencoded`; they once got 415.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{ADMIN_TOKEN, TestGateway};

/// The documentation the examples are read from, in the order they run.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

/// The `curl` commands in `text` that call the admin API: whole lines (a trailing `\` joins
/// the next) or inline code spans that start with `curl`.
fn admin_curls(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        match line.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head.trim());
                pending.push(' ');
            }
            None => {
                pending.push_str(line.trim_start());
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    lines
        .into_iter()
        .filter_map(|line| {
            if line.starts_with("curl ") {
                return Some(line);
            }
            let (_, span) = line.split_once("`curl ")?;
            Some(format!("curl {}", span.split('`').next()?))
        })
        .filter(|command| command.contains("/admin/"))
        .collect()
}

/// The JSON bodies `docs/admin-api.md`'s endpoint table shows for its `POST`s, as curl
/// commands: (path, body).
fn table_bodies(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|row| {
            let rest = row.strip_prefix("| `POST /admin/")?;
            let path: String = rest
                .chars()
                .take_while(|c| !matches!(c, '`' | '[' | '?'))
                .collect();
            let body = row.split("`{").nth(1)?.split("}`").next()?;
            Some((format!("/admin/{path}"), format!("{{{body}}}")))
        })
        .collect()
}

/// What the examples leave to the reader, filled in for the test's gateway: the hosts they
/// name, the tokens they spell out, and a key's id from an earlier answer.
fn fill_in(command: &str, address: &str, key_id: Option<&str>) -> String {
    let mut command = command
        .replace("https://gw:9090", &format!("http://{address}"))
        .replace("localhost:8080", address)
        .replace("10.0.0.1:8080", address)
        .replace("x-admin-token: …", &format!("x-admin-token: {ADMIN_TOKEN}"))
        .replace(
            "Bearer fleet-admin-token-0123",
            &format!("Bearer {ADMIN_TOKEN}"),
        );
    if let Some(id) = key_id {
        command = command.replace("KEY_ID", id);
    }
    command
}

/// Runs `command` with `sh` in `dir`, curl wrapped to write the body to a file and print the
/// status; answers (status, body).
async fn run(command: &str, dir: &Path) -> (u16, String) {
    let body = dir.join("answer.json");
    let script = format!(
        "curl() {{ command curl -sS -o \"$ANSWER\" -w '%{{http_code}}' \"$@\"; }}\n{command}"
    );
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .env("ANSWER", &body)
        .env("RINGMASTER_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("OPERATOR", ADMIN_TOKEN)
        .output()
        .await
        .expect("sh and curl run");
    let status = String::from_utf8_lossy(&out.stdout);
    let status = status.trim().parse().unwrap_or_else(|_| {
        panic!(
            "{command}: no status from curl ({status:?}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (status, std::fs::read_to_string(&body).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_example_in_the_docs_answers_as_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The tenant the examples' keys name exists, as in the deployment they describe.
    let gw = TestGateway::simulated(
        2,
        0.01,
        "[[tenants]]\nname = \"team-a\"\nrequests_per_minute = 60\n",
    )
    .await;
    let address = gw.addr.to_string();
    // The components the examples upload (`--data-binary @my-router.wasm`): a router each.
    let dir = tempfile::tempdir().unwrap();
    let router = std::fs::read(root.join("policies/dist/round-robin.wasm")).unwrap();
    let mut commands = Vec::new();
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        for command in admin_curls(&text) {
            for upload in command.split(" @").skip(1) {
                let file = upload.split_whitespace().next().unwrap();
                std::fs::write(dir.path().join(file), &router).unwrap();
            }
            commands.push((name.clone(), command));
        }
        if name == "docs/admin-api.md" {
            for (path, body) in table_bodies(&text) {
                commands.push((
                    format!("{name} (the endpoint table)"),
                    format!(
                        "curl -H \"authorization: Bearer $RINGMASTER_ADMIN_TOKEN\" -d '{body}' \
                         http://{address}{path}"
                    ),
                ));
            }
        }
    }
    // The examples this test was written against, at least: a new one joins by itself.
    assert!(commands.len() >= 12, "{commands:#?}");
    assert!(
        commands
            .iter()
            .any(|(_, c)| c.contains(" -d ") && !c.contains("content-type")),
        "no example sends a body without a content type: {commands:#?}"
    );
    let mut key_id: Option<String> = None;
    for (doc, command) in &commands {
        let filled = fill_in(command, &address, key_id.as_deref());
        assert!(
            !filled.contains('…') && !filled.contains("KEY_ID"),
            "{doc}: `{command}` leaves a placeholder this test does not fill in"
        );
        let (status, body) = run(&filled, dir.path()).await;
        assert!(
            (200..300).contains(&status),
            "{doc}: `{command}` answered {status}: {body}"
        );
        let answer: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{doc}: `{command}` answered no JSON ({e}): {body}"));
        if command.contains("/admin/keys") && command.contains(" -d ") {
            // "the answer holds the key, shown this once"
            assert!(
                answer["key"].as_str().is_some_and(|k| k.starts_with("sk-")),
                "{doc}: `{command}`: {answer}"
            );
            key_id = answer["id"].as_str().map(str::to_owned);
        }
    }
}

/// The admin API takes JSON for what it is, whatever the content type says; a body that is
/// not JSON is still refused, with 415 naming the content type (and with 400 when the type
/// said JSON, as before), while the doors keep asking for `application/json`.
#[tokio::test]
async fn an_admin_body_is_json_by_its_content_not_its_label() {
    let gw = TestGateway::simulated(1, 0.01, "").await;
    let post = async |content_type: Option<&str>, body: &str| {
        let mut request = gw
            .admin(reqwest::Method::POST, "/admin/tenants")
            .await
            .body(body.to_owned());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    };
    let tenant = r#"{"name": "team-b", "requests_per_minute": 60}"#;
    for content_type in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
    ] {
        let (status, body) = post(content_type, tenant).await;
        assert_eq!(status, 201, "{content_type:?}: {body}");
    }
    let (status, body) = post(Some("application/x-www-form-urlencoded"), "name=team-b").await;
    assert_eq!(status, 415, "{body}");
    assert!(
        body.contains("must be JSON") && body.contains("application/x-www-form-urlencoded"),
        "{body}"
    );
    let (status, body) = post(Some("application/json"), "name=team-b").await;
    assert_eq!(status, 400, "{body}");
    let door = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("content-type", "text/plain")
        .body(crate::support::hello(2).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(door.status(), 415);
}

/// What the extraction reads, on lines shaped like the docs' own.
#[test]
fn the_examples_are_read_as_the_shell_reads_them() {
    let text = "```sh\n# a comment\ncurl -H \"authorization: Bearer $T\" -d '{\"a\": 1}' \\\n  \
                https://gw:9090/admin/tenants\ncurl -s localhost:8080/v1/messages -d '{}'\n```\n\
                4. **Compare**: `curl -H \"x\" localhost:8080/admin/experiments` gives\n";
    assert_eq!(
        admin_curls(text),
        [
            "curl -H \"authorization: Bearer $T\" -d '{\"a\": 1}' https://gw:9090/admin/tenants",
            "curl -H \"x\" localhost:8080/admin/experiments",
        ]
    );
    let table = "| `POST /admin/servers` | add one: `{\"address\": \"sim://gpu-4\"}` |\n\
                 | `GET /admin/servers` | servers |\n\
                 | `POST /admin/route/explain[?door=chat]` | a request body in |\n";
    assert_eq!(
        table_bodies(table),
        [(
            "/admin/servers".to_owned(),
            "{\"address\": \"sim://gpu-4\"}".to_owned()
        )]
    );
}
