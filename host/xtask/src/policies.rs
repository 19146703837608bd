//! `cargo xtask policies [--check]`: the built-in policies and the test fixtures, as
//! reproducible components.
//!
//! What it does:
//!
//! 1. Finds the guests: every crate directly under `policies/` (a built-in policy, written to
//!    `policies/dist/<dir>.wasm`) and under `policies/fixtures/` (a deliberately broken
//!    component for the host's tests, written to `policies/dist/fixtures/<dir>.wasm`).
//! 2. Picks a toolchain (see [`crate::toolchain`]) and prints it in one line.
//! 3. Builds them all in one cargo invocation into `$CARGO_TARGET_DIR/wasm-policies`
//!    (default `target/wasm-policies`), so the guest compiler never touches the host's
//!    artifacts. The guests' release profile (`opt-level = "s"`, fat LTO, `panic = "abort"`,
//!    one codegen unit, no debug info) is set with `--config` flags: the workspace's own
//!    release profile, which the host uses, stays as it is.
//! 4. Makes the bytes reproducible: the checkout, `CARGO_HOME`, the target folder and the
//!    standard library's source are remapped (`--remap-path-prefix`) to fixed names, there is
//!    no debug info, and no environment flags (`RUSTFLAGS`, wrappers, profile overrides) leak
//!    in. The same source gives the same bytes in any checkout folder.
//! 5. Turns each core module into a component (see [`crate::wasm`]) and writes it, with a
//!    `MANIFEST` listing each file's size, SHA-256 and the compiler's `rustc --version`.
//!
//! With `--check` the components go to a temporary folder instead and are compared with the
//! committed ones: any difference (or a toolchain other than the MANIFEST's, which alone
//! changes the bytes) fails the command, naming what differs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use ringmaster_policy_kit::toolchain::{self, Toolchain};
use ringmaster_policy_kit::wasm;

/// Where the components go, relative to the workspace root.
const DIST: &str = "policies/dist";
/// The manifest's file name inside [`DIST`].
const MANIFEST: &str = "MANIFEST";
/// Which kind of guest a crate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Policy,
    Fixture,
}

/// One crate to build.
#[derive(Debug, Clone)]
struct Guest {
    /// Its folder's name, which names the component.
    name: String,
    /// Its package name.
    package: String,
    kind: Kind,
    /// `[package.metadata.ringmaster] start-function`.
    start_function: Option<String>,
}

impl Guest {
    /// The component's path inside [`DIST`].
    fn dist_path(&self) -> String {
        match self.kind {
            Kind::Policy => format!("{}.wasm", self.name),
            Kind::Fixture => format!("fixtures/{}.wasm", self.name),
        }
    }

    /// The core module's file name in cargo's output folder.
    fn artifact(&self) -> String {
        format!("{}.wasm", self.package.replace('-', "_"))
    }
}

/// One built component.
#[derive(Debug)]
struct Built {
    path: String,
    bytes: Vec<u8>,
    sha256: String,
}

/// Runs the command; `Ok(FAILURE)` when `--check` found differences.
pub fn run(root: &Path, check: bool) -> Result<ExitCode> {
    let started = Instant::now();
    let guests = discover(root)?;
    // The dist build is the project's own (CI runs it as root): it may install the toolchain.
    let toolchain = toolchain::detect(workspace_rust_version(root)?.as_deref(), true)?;
    eprintln!("toolchain: {}", toolchain.describe());

    let dist = root.join(DIST);
    if check && let Some(message) = toolchain_mismatch(&dist, &toolchain)? {
        eprintln!("{message}");
        return Ok(ExitCode::FAILURE);
    }

    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            }
        })
        .unwrap_or_else(|| root.join("target"))
        .join("wasm-policies");
    let build_started = Instant::now();
    cargo_build(root, &target_dir, &toolchain, &guests)?;
    eprintln!(
        "built {} crates in {:.1} s",
        guests.len(),
        build_started.elapsed().as_secs_f64()
    );

    let out_dir = target_dir.join(toolchain.target).join("release");
    let mut built = Vec::new();
    for guest in &guests {
        let core_path = out_dir.join(guest.artifact());
        let core =
            fs::read(&core_path).with_context(|| format!("reading {}", core_path.display()))?;
        let bytes = if wasm::is_component(&core) {
            core
        } else {
            wasm::componentize(&core, guest.start_function.as_deref())
                .with_context(|| format!("making a component of {}", guest.package))?
        };
        let sha256 = hex(&Sha256::digest(&bytes));
        eprintln!(
            "  {:<34} {:>8} bytes  sha256 {}",
            guest.dist_path(),
            bytes.len(),
            &sha256[..16]
        );
        built.push(Built {
            path: guest.dist_path(),
            bytes,
            sha256,
        });
    }
    let manifest = render_manifest(&built, &toolchain);

    if check {
        let scratch =
            std::env::temp_dir().join(format!("ringmaster-policies-check-{}", std::process::id()));
        let result =
            write_all(&scratch, &built, &manifest).and_then(|()| compare(&scratch, &dist, &built));
        let _ = fs::remove_dir_all(&scratch);
        let differences = result?;
        if differences.is_empty() {
            eprintln!(
                "check: all {} components and the MANIFEST match {DIST} ({:.1} s)",
                built.len(),
                started.elapsed().as_secs_f64()
            );
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("check FAILED: rebuilding does not reproduce the committed files:");
        for difference in &differences {
            eprintln!("  {difference}");
        }
        eprintln!("rebuild and commit them with `cargo xtask policies`.");
        return Ok(ExitCode::FAILURE);
    }

    write_all(&dist, &built, &manifest)?;
    for stale in stale_files(&dist, &built)? {
        fs::remove_file(dist.join(&stale))
            .with_context(|| format!("removing stale {DIST}/{stale}"))?;
        eprintln!("  removed stale {DIST}/{stale}");
    }
    let total: usize = built.iter().map(|b| b.bytes.len()).sum();
    eprintln!(
        "wrote {} components ({} bytes in all) and {DIST}/{MANIFEST} in {:.1} s",
        built.len(),
        total,
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The guest crates, policies first, each group sorted by name.
fn discover(root: &Path) -> Result<Vec<Guest>> {
    let mut guests = Vec::new();
    for (dir, kind) in [
        (root.join("policies"), Kind::Policy),
        (root.join("policies/fixtures"), Kind::Fixture),
    ] {
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = entry?.path();
            let manifest = path.join("Cargo.toml");
            if !manifest.is_file() {
                continue;
            }
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .context("a guest folder's name is not UTF-8")?
                .to_owned();
            let text = fs::read_to_string(&manifest)
                .with_context(|| format!("reading {}", manifest.display()))?;
            let doc: toml::Table =
                toml::from_str(&text).with_context(|| format!("parsing {}", manifest.display()))?;
            let package = doc
                .get("package")
                .and_then(|p| p.get("name"))
                .and_then(|n| n.as_str())
                .with_context(|| format!("{} has no package.name", manifest.display()))?
                .to_owned();
            let start_function = doc
                .get("package")
                .and_then(|p| p.get("metadata"))
                .and_then(|m| m.get("ringmaster"))
                .and_then(|r| r.get("start-function"))
                .and_then(|s| s.as_str())
                .map(str::to_owned);
            found.push(Guest {
                name,
                package,
                kind,
                start_function,
            });
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        guests.extend(found);
    }
    if guests.is_empty() {
        bail!("no crates under policies/");
    }
    Ok(guests)
}

/// `workspace.package.rust-version` from the root manifest.
fn workspace_rust_version(root: &Path) -> Result<Option<String>> {
    let text = fs::read_to_string(root.join("Cargo.toml")).context("reading Cargo.toml")?;
    let doc: toml::Table = toml::from_str(&text).context("parsing Cargo.toml")?;
    Ok(doc
        .get("workspace")
        .and_then(|w| w.get("package"))
        .and_then(|p| p.get("rust-version"))
        .and_then(|v| v.as_str())
        .map(str::to_owned))
}

/// The remapping flags that keep machine-specific paths out of the bytes. Later flags win
/// when several prefixes match, so the more specific folders come last.
fn remap_flags(root: &Path, target_dir: &Path, toolchain: &Toolchain) -> Vec<String> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    let mut pairs: Vec<(PathBuf, &str)> = vec![(root.to_path_buf(), "/ringmaster")];
    if let Some(home) = cargo_home {
        pairs.push((home, "/cargo"));
    }
    if let Some(src) = &toolchain.rust_src {
        pairs.push((src.clone(), "/rustc/src"));
    }
    pairs.push((target_dir.to_path_buf(), "/target"));
    let mut flags = Vec::new();
    for (from, to) in pairs {
        let mut variants = vec![from.clone()];
        if let Ok(real) = from.canonicalize()
            && real != from
        {
            variants.push(real);
        }
        for path in variants {
            flags.push(format!("--remap-path-prefix={}={to}", path.display()));
        }
    }
    flags
}

fn cargo_build(
    root: &Path,
    target_dir: &Path,
    toolchain: &Toolchain,
    guests: &[Guest],
) -> Result<()> {
    let mut cmd = toolchain.cargo_build(root);
    cmd.arg("--locked");
    for guest in guests {
        cmd.args(["-p", &guest.package]);
    }
    cmd.env("CARGO_TARGET_DIR", target_dir).env(
        "CARGO_ENCODED_RUSTFLAGS",
        remap_flags(root, target_dir, toolchain).join("\x1f"),
    );
    let status = cmd
        .status()
        .with_context(|| format!("running {}", toolchain.cargo.display()))?;
    if !status.success() {
        bail!("building the policies failed ({status})");
    }
    Ok(())
}

fn render_manifest(built: &[Built], toolchain: &Toolchain) -> String {
    let mut out = String::new();
    out.push_str(
        "# Ringmaster's built-in policy components and test fixtures, built by\n\
         # `cargo xtask policies` and checked by `cargo xtask policies --check`.\n\
         # Columns (tab-separated): file, bytes, sha256, the compiler's `rustc --version`.\n",
    );
    let _ = writeln!(out, "# target: {}", toolchain.method());
    for b in built {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}",
            b.path,
            b.bytes.len(),
            b.sha256,
            toolchain.version
        );
    }
    out
}

/// The committed MANIFEST's toolchain and target lines, if there is a MANIFEST.
fn committed_toolchain(dist: &Path) -> Result<Option<(String, String)>> {
    let path = dist.join(MANIFEST);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    let target = text
        .lines()
        .find_map(|l| l.strip_prefix("# target: "))
        .unwrap_or("")
        .to_owned();
    let version = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .find_map(|l| l.splitn(4, '\t').nth(3))
        .unwrap_or("")
        .to_owned();
    Ok(Some((version, target)))
}

/// A message when this machine's toolchain is not the one the MANIFEST records.
fn toolchain_mismatch(dist: &Path, toolchain: &Toolchain) -> Result<Option<String>> {
    let Some((version, target)) = committed_toolchain(dist)? else {
        return Ok(Some(format!(
            "check FAILED: {DIST}/{MANIFEST} is missing; build and commit the components with \
             `cargo xtask policies`"
        )));
    };
    if version == toolchain.version && target == toolchain.method() {
        return Ok(None);
    }
    Ok(Some(format!(
        "check FAILED: the toolchain differs from the MANIFEST's, so the bytes would differ for \
         that reason alone.\n  committed: {version} [{target}]\n  here:      {} [{}]\n\
         Check on a machine with the committed toolchain, or rebuild and commit with \
         `cargo xtask policies`.",
        toolchain.version,
        toolchain.method()
    )))
}

fn write_all(dir: &Path, built: &[Built], manifest: &str) -> Result<()> {
    fs::create_dir_all(dir.join("fixtures"))
        .with_context(|| format!("creating {}", dir.display()))?;
    for b in built {
        let path = dir.join(&b.path);
        fs::write(&path, &b.bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    fs::write(dir.join(MANIFEST), manifest).context("writing the MANIFEST")?;
    Ok(())
}

/// `.wasm` files under `dist` (and `dist/fixtures`) that the build did not produce.
fn stale_files(dist: &Path, built: &[Built]) -> Result<Vec<String>> {
    let mut stale = Vec::new();
    for sub in ["", "fixtures/"] {
        let dir = dist.join(sub);
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let rel = format!("{sub}{name}");
            if name.ends_with(".wasm") && !built.iter().any(|b| b.path == rel) {
                stale.push(rel);
            }
        }
    }
    stale.sort();
    Ok(stale)
}

/// Every difference between the rebuilt files in `fresh` and the committed ones in `dist`.
fn compare(fresh: &Path, dist: &Path, built: &[Built]) -> Result<Vec<String>> {
    let mut differences = Vec::new();
    let mut files: BTreeMap<String, ()> = built.iter().map(|b| (b.path.clone(), ())).collect();
    files.insert(MANIFEST.to_owned(), ());
    for rel in files.keys() {
        let new = fs::read(fresh.join(rel))?;
        match fs::read(dist.join(rel)) {
            Err(_) => differences.push(format!("{DIST}/{rel}: not committed")),
            Ok(old) if old != new => differences.push(format!(
                "{DIST}/{rel}: differs (committed {} bytes, sha256 {}; rebuilt {} bytes, sha256 {})",
                old.len(),
                &hex(&Sha256::digest(&old))[..16],
                new.len(),
                &hex(&Sha256::digest(&new))[..16],
            )),
            Ok(_) => {}
        }
    }
    for stale in stale_files(dist, built)? {
        differences.push(format!("{DIST}/{stale}: committed, but no crate builds it"));
    }
    Ok(differences)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toolchain() -> Toolchain {
        Toolchain {
            cargo: PathBuf::from("cargo"),
            rustc: None,
            version: "rustc 1.96.0 (ac68faa20 2026-05-25)".into(),
            target: "wasm32-unknown-unknown",
            build_std: true,
            rust_src: None,
            origin: "test",
        }
    }

    #[test]
    fn the_manifest_round_trips_its_toolchain() {
        let dir = std::env::temp_dir().join(format!("xtask-manifest-{}", std::process::id()));
        let built = [Built {
            path: "a.wasm".into(),
            bytes: vec![0, 97, 115, 109],
            sha256: hex(&Sha256::digest([0, 97, 115, 109])),
        }];
        let manifest = render_manifest(&built, &toolchain());
        assert!(manifest.contains(
            "a.wasm\t4\tcd5d4935a48c0672cb06407bb443bc0087aff947c6b864bac886982c73b3027f\trustc 1.96.0 (ac68faa20 2026-05-25)\n"
        ));
        write_all(&dir, &built, &manifest).unwrap();
        assert_eq!(toolchain_mismatch(&dir, &toolchain()).unwrap(), None);
        let mut other = toolchain();
        other.version = "rustc 1.97.0".into();
        let message = toolchain_mismatch(&dir, &other).unwrap().unwrap();
        assert!(message.contains("toolchain differs"), "{message}");
        assert!(compare(&dir, &dir, &built).unwrap().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
