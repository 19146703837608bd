//! Finding (or installing) a Rust toolchain that can build Wasm guests.
//!
//! In order of preference:
//!
//! 1. rustup's active toolchain, if it has the `wasm32-unknown-unknown` target installed
//!    (then `wasm32-wasip2`, whose output may already be a component but imports WASI);
//! 2. Debian's `rustc-web` (`/usr/bin/rustc`, `/usr/bin/cargo`) with the standard library's
//!    source from `rust-web-src`, building std for `wasm32-unknown-unknown` with
//!    `-Zbuild-std` (unlocked with `RUSTC_BOOTSTRAP=1`) and linking with `rust-lld`, which
//!    `rust-web-llvm` provides as a link to `lld-22` (only a *recommended* package of
//!    rustc-web, so an install with `--no-install-recommends` must name it);
//! 3. when that is incomplete, installing those packages with `apt-get` only when the caller
//!    says so (`ringmaster policy build --install-toolchain`, `cargo xtask policies`) and we
//!    run as root; else failing with the exact packages (about 900 MB), targets and commands
//!    that would fix it.
//!
//! Different toolchains give different bytes, so the choice is printed (and `cargo xtask
//! policies` records it in `policies/dist/MANIFEST`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{KitError, Result};

/// Debian's rustc-web compiler.
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
/// Debian's cargo-web.
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
/// The sysroot of Debian's rustc-web.
const DEBIAN_SYSROOT: &str = "/usr";
/// The linker rustc's Wasm targets call by name (from rust-web-llvm, a link to lld-22).
const DEBIAN_RUST_LLD: &str = "/usr/bin/rust-lld";
/// What `rust-lld` points at.
const DEBIAN_LLD: &str = "/usr/bin/lld-22";
/// The Debian packages of the fallback toolchain.
const DEBIAN_PACKAGES: [&str; 5] = [
    "rustc-web",
    "cargo-web",
    "rust-web-src",
    "rust-web-llvm",
    "lld-22",
];

/// How the guests get built.
#[derive(Debug, Clone)]
pub struct Toolchain {
    /// The cargo to run.
    pub cargo: PathBuf,
    /// The rustc it must use (`RUSTC`), when not the one on `PATH`.
    pub rustc: Option<PathBuf>,
    /// The compiler's `rustc --version`.
    pub version: String,
    /// The target triple.
    pub target: &'static str,
    /// Whether std is built from source (`-Zbuild-std`).
    pub build_std: bool,
    /// The standard library's source, whose paths get remapped.
    pub rust_src: Option<PathBuf>,
    /// Where it comes from, for people.
    pub origin: &'static str,
}

impl Toolchain {
    /// One line describing the choice, for the log and the MANIFEST.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}, {}{})",
            self.version,
            self.origin,
            self.target,
            if self.build_std {
                ", std built from source"
            } else {
                ""
            }
        )
    }

    /// The build method without the version: the MANIFEST's `target` line.
    pub fn method(&self) -> String {
        format!(
            "{}{}",
            self.target,
            if self.build_std {
                " (std built from source)"
            } else {
                ""
            }
        )
    }
}

/// The guests' release profile, as `--config profile.release.<key>=<value>` flags: small,
/// no unwinding, nothing machine-specific.
pub const GUEST_PROFILE: [(&str, &str); 9] = [
    ("opt-level", "\"s\""),
    ("lto", "true"),
    ("panic", "\"abort\""),
    ("codegen-units", "1"),
    ("debug", "false"),
    ("strip", "\"debuginfo\""),
    ("incremental", "false"),
    ("debug-assertions", "false"),
    ("overflow-checks", "false"),
];
/// Environment variables that would change what cargo builds; cleared for a guest build (the
/// host's clippy wrapper, CI's flags and target settings must not reach it).
pub const CLEARED_ENV: [&str; 9] = [
    "RUSTFLAGS",
    "CLIPPY_ARGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "RUSTC",
];

impl Toolchain {
    /// `cargo build --release` for the guest target in `dir`, with this toolchain's compiler
    /// and std and the guests' release profile; the caller adds packages and flags.
    pub fn cargo_build(&self, dir: &Path) -> Command {
        let mut cmd = Command::new(&self.cargo);
        cmd.current_dir(dir)
            .args(["build", "--release", "--target", self.target]);
        if self.build_std {
            cmd.arg("-Zbuild-std=std,panic_abort");
            // Debian's rustc is a stable release; this unlocks `-Zbuild-std` on it.
            cmd.env("RUSTC_BOOTSTRAP", "1");
        }
        for (key, value) in GUEST_PROFILE {
            cmd.arg("--config")
                .arg(format!("profile.release.{key}={value}"));
        }
        for var in CLEARED_ENV {
            cmd.env_remove(var);
        }
        for (var, _) in std::env::vars_os() {
            let var = var.to_string_lossy();
            if var.starts_with("CARGO_PROFILE_") || var.starts_with("CARGO_TARGET_WASM32") {
                cmd.env_remove(&*var);
            }
        }
        if let Some(rustc) = &self.rustc {
            cmd.env("RUSTC", rustc);
        }
        cmd
    }
}

/// Picks the toolchain, installing Debian's when `install` allows it and it is needed.
pub fn detect(min_rust_version: Option<&str>, install: bool) -> Result<Toolchain> {
    let installed = rustup_targets();
    for target in ["wasm32-unknown-unknown", "wasm32-wasip2"] {
        if installed.iter().any(|t| t == target) {
            let version = rustc_version(Path::new("rustc"))?;
            let sysroot = command_output(Command::new("rustc").args(["--print", "sysroot"]))?;
            return Ok(Toolchain {
                cargo: PathBuf::from("cargo"),
                rustc: None,
                version,
                target,
                build_std: false,
                rust_src: Some(Path::new(sysroot.trim()).join("lib/rustlib/src/rust")),
                origin: "rustup",
            });
        }
    }

    let mut missing = debian_missing();
    if may_install(!missing.is_empty(), install, is_root(), which("apt-get")) {
        eprintln!(
            "toolchain: rustup has no wasm target; installing Debian's {} with apt-get",
            DEBIAN_PACKAGES.join(" ")
        );
        apt_install()?;
        missing = debian_missing();
    }
    if !missing.is_empty() {
        let list: Vec<String> = missing
            .iter()
            .map(|(package, path)| format!("{package} ({path})"))
            .collect();
        return Err(KitError::Toolchain(format!(
            "no toolchain can build Wasm guests here.\n\
             rustup has neither the wasm32-unknown-unknown nor the wasm32-wasip2 target, and \
             Debian's fallback is missing: {}.\n\
             Fix it with one of:\n  \
             rustup target add wasm32-unknown-unknown\n  \
             sudo apt-get install {}   (about 900 MB; `ringmaster policy build \
             --install-toolchain` runs it when run as root)",
            list.join(", "),
            DEBIAN_PACKAGES.join(" ")
        )));
    }
    let rustc = PathBuf::from(DEBIAN_RUSTC);
    let version = rustc_version(&rustc)?;
    if let Some(min) = min_rust_version
        && !version_at_least(&version, min)
    {
        return Err(KitError::Toolchain(format!(
            "{DEBIAN_RUSTC} is `{version}`, older than the workspace's rust-version {min}; \
             install a newer rustc-web (sudo apt-get install {}) or \
             `rustup target add wasm32-unknown-unknown`",
            DEBIAN_PACKAGES.join(" ")
        )));
    }
    Ok(Toolchain {
        cargo: PathBuf::from(DEBIAN_CARGO),
        rustc: Some(rustc),
        version,
        target: "wasm32-unknown-unknown",
        build_std: true,
        rust_src: Some(Path::new(DEBIAN_SYSROOT).join("lib/rustlib/src/rust")),
        origin: "Debian rustc-web",
    })
}

/// The targets rustup's active toolchain has; empty without rustup.
fn rustup_targets() -> Vec<String> {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.trim().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The Debian packages whose files are missing, with the file that tells.
fn debian_missing() -> Vec<(&'static str, String)> {
    let src_lock = Path::new(DEBIAN_SYSROOT).join("lib/rustlib/src/rust/library/Cargo.lock");
    let checks: [(&str, PathBuf); 5] = [
        ("rustc-web", PathBuf::from(DEBIAN_RUSTC)),
        ("cargo-web", PathBuf::from(DEBIAN_CARGO)),
        ("rust-web-src", src_lock),
        ("rust-web-llvm", PathBuf::from(DEBIAN_RUST_LLD)),
        ("lld-22", PathBuf::from(DEBIAN_LLD)),
    ];
    checks
        .into_iter()
        .filter(|(_, path)| !path.exists())
        .map(|(package, path)| (package, path.display().to_string()))
        .collect()
}

fn apt_install() -> Result<()> {
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(DEBIAN_PACKAGES)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    let spawn = |source| KitError::Spawn {
        command: "apt-get".into(),
        source,
    };
    if install().map_err(spawn)?.success() {
        return Ok(());
    }
    // The package lists may be stale or absent: refresh them once and retry.
    let update = Command::new("apt-get")
        .arg("update")
        .status()
        .map_err(spawn)?;
    if update.success() && install().map_err(spawn)?.success() {
        return Ok(());
    }
    Err(KitError::Toolchain(format!(
        "apt-get could not install {}; install them by hand or run \
         `rustup target add wasm32-unknown-unknown`",
        DEBIAN_PACKAGES.join(" ")
    )))
}

/// Whether to run apt-get: something is missing, the caller asked for it, and it can work.
fn may_install(missing: bool, asked: bool, root: bool, apt_get: bool) -> bool {
    missing && asked && root && apt_get
}

fn is_root() -> bool {
    command_output(Command::new("id").arg("-u")).is_ok_and(|uid| uid.trim() == "0")
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// `rustc --version` of `rustc`.
pub fn rustc_version(rustc: &Path) -> Result<String> {
    let version = command_output(Command::new(rustc).arg("--version"))?;
    Ok(version.trim().to_owned())
}

fn command_output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().map_err(|source| KitError::Spawn {
        command: format!("{cmd:?}"),
        source,
    })?;
    if !out.status.success() {
        return Err(KitError::Failed {
            command: format!("{cmd:?}"),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `rustc X.Y.Z (…)` is at least `min` (`X.Y` or `X.Y.Z`).
fn version_at_least(version: &str, min: &str) -> bool {
    let parse = |s: &str| -> Vec<u64> {
        s.split('.')
            .map(|part| part.split('-').next().unwrap_or("").parse().unwrap_or(0))
            .collect()
    };
    let have = version
        .split_whitespace()
        .nth(1)
        .map(parse)
        .unwrap_or_default();
    let want = parse(min);
    for i in 0..want.len().max(have.len()) {
        let (h, w) = (
            have.get(i).copied().unwrap_or(0),
            want.get(i).copied().unwrap_or(0),
        );
        if h != w {
            return h > w;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toolchain_is_installed_only_when_asked() {
        // Root with apt-get and something missing: still only with --install-toolchain.
        assert!(!may_install(true, false, true, true));
        assert!(may_install(true, true, true, true));
        assert!(!may_install(false, true, true, true), "nothing missing");
        assert!(!may_install(true, true, false, true), "not root");
        assert!(!may_install(true, true, true, false), "no apt-get");
    }

    #[test]
    fn versions_compare_numerically() {
        let v = "rustc 1.96.0 (ac68faa20 2026-05-25) (built from a source tarball)";
        assert!(version_at_least(v, "1.95"));
        assert!(version_at_least(v, "1.96.0"));
        assert!(!version_at_least(v, "1.97"));
        assert!(!version_at_least("rustc 1.63.0", "1.85"));
        assert!(version_at_least("rustc 1.100.0-nightly", "1.95"));
    }
}
