//! `ringmaster policy build`: a project to a component, with the toolchain its language
//! needs, found or (where the kit may) installed.
//!
//! - **Rust**: the toolchain [`crate::toolchain::detect`] picks (rustup's Wasm target, else
//!   Debian's rustc-web with std built from source), then [`crate::wasm::componentize`].
//! - **Python**: `componentize-py` (pinned: [`COMPONENTIZE_PY`]) in a virtualenv under the
//!   user's cache directory, created on first use from PyPI.
//!
//! When a toolchain is missing and cannot be installed, the error names exactly what to
//! install.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::scaffold::{Lang, Project};
use crate::{KitError, Result, io_error, toolchain, wasm};

/// The componentize-py release Python policies are built with.
pub const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// A built component.
#[derive(Clone, Debug)]
pub struct Built {
    /// Where it was written (`DIR/NAME.wasm`).
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: usize,
    /// The toolchain that built it, for people.
    pub toolchain: String,
    /// How long the build took.
    pub elapsed: Duration,
}

/// Where the kit keeps toolchains it installs: `$RINGMASTER_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/ringmaster`, else `~/.cache/ringmaster`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RINGMASTER_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("ringmaster");
    }
    std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/ringmaster"))
        .unwrap_or_else(|| std::env::temp_dir().join("ringmaster-cache"))
}

/// Builds the project in `dir` to `DIR/NAME.wasm`. `say` hears each step, for a progress
/// line.
pub fn build(dir: &Path, say: &mut dyn FnMut(&str)) -> Result<Built> {
    let project = Project::open(dir)?;
    let started = Instant::now();
    let out = dir.join(format!("{}.wasm", project.name));
    let toolchain = match project.lang {
        Lang::Rust => build_rust(&project, &out, say)?,
        Lang::Python => build_python(&project, &out, say)?,
    };
    let size = std::fs::metadata(&out).map_err(io_error(&out))?.len() as usize;
    Ok(Built {
        path: out,
        size,
        toolchain,
        elapsed: started.elapsed(),
    })
}

fn run(cmd: &mut Command) -> Result<()> {
    let command = format!("{cmd:?}");
    let status = cmd.status().map_err(|source| KitError::Spawn {
        command: command.clone(),
        source,
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(KitError::Failed {
            command,
            detail: status.to_string(),
        })
    }
}

fn build_rust(project: &Project, out: &Path, say: &mut dyn FnMut(&str)) -> Result<String> {
    say("finding a Rust toolchain for Wasm");
    let toolchain = toolchain::detect(None)?;
    say(&format!("building with {}", toolchain.describe()));
    let target_dir = project.dir.join("target");
    run(toolchain
        .cargo_build(&project.dir)
        .env("CARGO_TARGET_DIR", &target_dir))?;
    let core = target_dir
        .join(toolchain.target)
        .join("release")
        .join(format!("{}.wasm", project.name.replace('-', "_")));
    let bytes = std::fs::read(&core).map_err(io_error(&core))?;
    say("encoding the component");
    let component = if wasm::is_component(&bytes) {
        bytes
    } else {
        wasm::componentize(&bytes, None)?
    };
    std::fs::write(out, component).map_err(io_error(out))?;
    Ok(toolchain.describe())
}

/// The virtualenv's `componentize-py`, created (from PyPI) on first use.
pub fn componentize_py(say: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let version = COMPONENTIZE_PY.replace("==", "-");
    let venv = cache_dir().join("toolchains").join(version);
    let program = venv.join("bin/componentize-py");
    if program.is_file() {
        return Ok(program);
    }
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok())
        .ok_or_else(|| {
            KitError::Toolchain(
                "building a Python policy needs python3 (3.10 or newer, with venv): \
                 install it (Debian: apt-get install python3 python3-venv) and run again"
                    .into(),
            )
        })?;
    say(&format!(
        "installing {COMPONENTIZE_PY} into {} (once)",
        venv.display()
    ));
    std::fs::create_dir_all(venv.parent().unwrap_or(&venv)).map_err(io_error(&venv))?;
    run(Command::new(python).args(["-m", "venv"]).arg(&venv)).map_err(|e| {
        KitError::Toolchain(format!(
            "{e}\ncreating a virtualenv failed: install python3-venv (Debian: apt-get \
             install python3-venv) and run again"
        ))
    })?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        COMPONENTIZE_PY,
    ]))
    .map_err(|e| {
        KitError::Toolchain(format!(
            "{e}\ninstalling {COMPONENTIZE_PY} from PyPI failed; install it by hand into \
             {} and run again",
            venv.display()
        ))
    })?;
    Ok(program)
}

fn build_python(project: &Project, out: &Path, say: &mut dyn FnMut(&str)) -> Result<String> {
    let componentize = componentize_py(say)?;
    say(&format!(
        "componentizing app.py for world {}",
        project.world
    ));
    let mut cmd = Command::new(&componentize);
    cmd.current_dir(&project.dir).args([
        "-d",
        "wit",
        "-w",
        &project.world,
        "componentize",
        "app",
        "-p",
        ".",
    ]);
    for dir in &project.python_path {
        cmd.arg("-p").arg(dir);
    }
    run(cmd.arg("-o").arg(out))?;
    Ok(COMPONENTIZE_PY.to_owned())
}
