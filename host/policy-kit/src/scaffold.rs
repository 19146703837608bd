//! `ringmaster policy new`: a standalone policy project, ready to build and test.
//!
//! Everything the project needs is written into it: the WIT it targets, the SDK (vendored,
//! so the project builds offline and its bindings always match its WIT), a sample router
//! and its unit test. Nothing refers back to this repository.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::{KitError, Result, io_error};

/// A language a project is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// Rust with the vendored `ringmaster-policy-sdk`.
    Rust,
    /// Python with componentize-py and the vendored `ringmaster_policy` package.
    Python,
    /// JavaScript with componentize-js and the vendored `ringmaster-policy.js` module.
    JavaScript,
    /// C with Zig's C compiler, wit-bindgen's C bindings and the vendored
    /// `ringmaster_policy.h`.
    C,
}

impl Lang {
    /// Every language `new` scaffolds.
    pub const ALL: [Lang; 4] = [Lang::Rust, Lang::Python, Lang::JavaScript, Lang::C];

    /// The language's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rust => "rust",
            Self::Python => "python",
            Self::JavaScript => "js",
            Self::C => "c",
        }
    }

    /// How the project's unit tests run, natively.
    pub fn test_command(self) -> &'static str {
        match self {
            Self::Rust => "cargo test",
            Self::Python => "python3 -m unittest discover -s tests",
            Self::JavaScript => "node --test test/",
            Self::C => "make test",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|l| l.as_str() == name)
            .ok_or_else(|| {
                KitError::Project(format!(
                    "--lang {name}: not a language `ringmaster policy new` scaffolds \
                     (rust, python, js, c)"
                ))
            })
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The project file every scaffolded project carries: what it is, for `build`.
pub const PROJECT_FILE: &str = "ringmaster-policy.toml";

/// The contract, as this binary was built with it: `ringmaster:policy@0.3.0`, which every
/// new project targets (components built against 0.2.0 and 0.1.0 keep loading). A JavaScript
/// sample imports its interfaces by this version (`ringmaster:policy/cluster@0.3.0`).
pub const WIT: &str = include_str!("../../../wit/policy.wit");

const RUST_SDK: [(&str, &str); 6] = [
    ("src/lib.rs", include_str!("../../../sdk/src/lib.rs")),
    ("src/config.rs", include_str!("../../../sdk/src/config.rs")),
    ("src/decide.rs", include_str!("../../../sdk/src/decide.rs")),
    ("src/store.rs", include_str!("../../../sdk/src/store.rs")),
    (
        "src/testing.rs",
        include_str!("../../../sdk/src/testing.rs"),
    ),
    (
        "Cargo.toml",
        include_str!("../templates/rust/sdk-Cargo.toml.in"),
    ),
];
const PYTHON_SDK: [(&str, &str); 3] = [
    (
        "__init__.py",
        include_str!("../../../sdk/python/ringmaster_policy/__init__.py"),
    ),
    (
        "decide.py",
        include_str!("../../../sdk/python/ringmaster_policy/decide.py"),
    ),
    (
        "testing.py",
        include_str!("../../../sdk/python/ringmaster_policy/testing.py"),
    ),
];

const JS_SDK: &str = include_str!("../../../sdk/js/ringmaster-policy.js");

const C_SDK: &str = include_str!("../../../sdk/c/ringmaster_policy.h");

/// Every C project's build file (the examples link to it).
const C_MAKEFILE: &str = include_str!("../templates/c/Makefile");

/// A sample policy: one of the projects under `examples/`, which `tests/run` builds and
/// serves. `new` writes its files with the example's name replaced by the new project's, so
/// each sample exists once and what users get is what is tested.
struct Sample {
    /// The example's name (its directory under `examples/`).
    name: &'static str,
    /// Its files that a new project gets: (path in the project, text).
    files: &'static [(&'static str, &'static str)],
}

impl Sample {
    fn as_project(&self, text: &str, name: &str) -> String {
        text.replace(self.name, name)
    }
}

const PYTHON_ROUTER: Sample = Sample {
    name: "python-router",
    files: &[
        (
            "app.py",
            include_str!("../../../examples/python-router/app.py"),
        ),
        (
            "policy.py",
            include_str!("../../../examples/python-router/policy.py"),
        ),
        (
            "tests/test_policy.py",
            include_str!("../../../examples/python-router/tests/test_policy.py"),
        ),
    ],
};

const PYTHON_ADMISSION: Sample = Sample {
    name: "python-admission",
    files: &[
        (
            "app.py",
            include_str!("../../../examples/python-admission/app.py"),
        ),
        (
            "policy.py",
            include_str!("../../../examples/python-admission/policy.py"),
        ),
        (
            "tests/test_policy.py",
            include_str!("../../../examples/python-admission/tests/test_policy.py"),
        ),
    ],
};

const PYTHON_SAFETY: Sample = Sample {
    name: "python-safety",
    files: &[
        (
            "app.py",
            include_str!("../../../examples/python-safety/app.py"),
        ),
        (
            "policy.py",
            include_str!("../../../examples/python-safety/policy.py"),
        ),
        (
            "tests/test_policy.py",
            include_str!("../../../examples/python-safety/tests/test_policy.py"),
        ),
    ],
};

const JS_SAFETY: Sample = Sample {
    name: "js-safety",
    files: &[
        ("app.js", include_str!("../../../examples/js-safety/app.js")),
        (
            "policy.js",
            include_str!("../../../examples/js-safety/policy.js"),
        ),
        (
            "test/policy.test.js",
            include_str!("../../../examples/js-safety/test/policy.test.js"),
        ),
        (
            "package.json",
            include_str!("../../../examples/js-safety/package.json"),
        ),
    ],
};

const JS_ROUTER: Sample = Sample {
    name: "js-router",
    files: &[
        ("app.js", include_str!("../../../examples/js-router/app.js")),
        (
            "policy.js",
            include_str!("../../../examples/js-router/policy.js"),
        ),
        (
            "test/policy.test.js",
            include_str!("../../../examples/js-router/test/policy.test.js"),
        ),
        (
            "package.json",
            include_str!("../../../examples/js-router/package.json"),
        ),
    ],
};

const JS_ADMISSION: Sample = Sample {
    name: "js-admission",
    files: &[
        (
            "app.js",
            include_str!("../../../examples/js-admission/app.js"),
        ),
        (
            "policy.js",
            include_str!("../../../examples/js-admission/policy.js"),
        ),
        (
            "test/policy.test.js",
            include_str!("../../../examples/js-admission/test/policy.test.js"),
        ),
        (
            "package.json",
            include_str!("../../../examples/js-admission/package.json"),
        ),
    ],
};

const C_ROUTER: Sample = Sample {
    name: "c-router",
    files: &[
        ("app.c", include_str!("../../../examples/c-router/app.c")),
        (
            "policy.c",
            include_str!("../../../examples/c-router/policy.c"),
        ),
        (
            "policy.h",
            include_str!("../../../examples/c-router/policy.h"),
        ),
        (
            "tests/test_policy.c",
            include_str!("../../../examples/c-router/tests/test_policy.c"),
        ),
    ],
};

const C_ADMISSION: Sample = Sample {
    name: "c-admission",
    files: &[
        ("app.c", include_str!("../../../examples/c-admission/app.c")),
        (
            "policy.c",
            include_str!("../../../examples/c-admission/policy.c"),
        ),
        (
            "policy.h",
            include_str!("../../../examples/c-admission/policy.h"),
        ),
        (
            "tests/test_policy.c",
            include_str!("../../../examples/c-admission/tests/test_policy.c"),
        ),
    ],
};

const C_SAFETY: Sample = Sample {
    name: "c-safety",
    files: &[
        ("app.c", include_str!("../../../examples/c-safety/app.c")),
        (
            "policy.c",
            include_str!("../../../examples/c-safety/policy.c"),
        ),
        (
            "policy.h",
            include_str!("../../../examples/c-safety/policy.h"),
        ),
        (
            "tests/test_policy.c",
            include_str!("../../../examples/c-safety/tests/test_policy.c"),
        ),
    ],
};

/// The wit-bindgen line the vendored Rust SDK is written against.
pub const WIT_BINDGEN_VERSION: &str = "0.61";

/// Writes a new router project called `name` in `dir` (which must not exist or be empty);
/// returns the files written, relative to `dir`.
pub fn new_project(dir: &Path, name: &str, lang: Lang, world: &str) -> Result<Vec<PathBuf>> {
    check_name(name)?;
    if !["router", "admission", "safety-filter"].contains(&world) {
        return Err(KitError::Project(format!(
            "--world {world}: not a world of ringmaster:policy (router, admission, \
             safety-filter)"
        )));
    }
    if dir
        .read_dir()
        .is_ok_and(|mut entries| entries.next().is_some())
    {
        return Err(KitError::Project(format!(
            "{}: already exists and is not empty; choose a new directory",
            dir.display()
        )));
    }
    let vars = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{world}}", world)
            .replace("{{lang}}", lang.as_str())
            .replace("{{wit_bindgen}}", WIT_BINDGEN_VERSION)
            .replace("{{test_command}}", lang.test_command())
            .replace("{{world_commands}}", &world_commands(name, world))
            .replace(
                "{{sdk_dir}}",
                match lang {
                    Lang::Rust => "ringmaster-policy-sdk/",
                    Lang::Python => "ringmaster_policy/",
                    Lang::JavaScript => "ringmaster-policy.js",
                    Lang::C => "ringmaster_policy.h",
                },
            )
    };
    let mut files: Vec<(PathBuf, String)> = vec![
        ("wit/policy.wit".into(), WIT.to_owned()),
        (
            PROJECT_FILE.into(),
            format!("name = \"{name}\"\nlang = \"{lang}\"\nworld = \"{world}\"\n"),
        ),
        (
            "README.md".into(),
            vars(include_str!("../templates/README.md.in")),
        ),
    ];
    match lang {
        Lang::Rust => {
            files.push((
                "Cargo.toml".into(),
                vars(include_str!("../templates/rust/Cargo.toml.in")),
            ));
            let lib = match world {
                "safety-filter" => include_str!("../templates/rust-safety/src/lib.rs"),
                "admission" => include_str!("../templates/rust-admission/src/lib.rs"),
                _ => include_str!("../templates/rust/src/lib.rs"),
            };
            files.push(("src/lib.rs".into(), vars(lib)));
            files.push((".gitignore".into(), "/target\n*.wasm\n".into()));
            for (path, text) in RUST_SDK {
                files.push((Path::new("ringmaster-policy-sdk").join(path), vars(text)));
            }
        }
        Lang::JavaScript => {
            let sample = match world {
                "safety-filter" => &JS_SAFETY,
                "admission" => &JS_ADMISSION,
                _ => &JS_ROUTER,
            };
            for (path, text) in sample.files {
                files.push((path.into(), sample.as_project(text, name)));
            }
            files.push((
                ".gitignore".into(),
                "node_modules/\ntarget/\n*.wasm\n".into(),
            ));
            files.push(("ringmaster-policy.js".into(), JS_SDK.to_owned()));
        }
        Lang::C => {
            let sample = match world {
                "safety-filter" => &C_SAFETY,
                "admission" => &C_ADMISSION,
                _ => &C_ROUTER,
            };
            for (path, text) in sample.files {
                files.push((path.into(), sample.as_project(text, name)));
            }
            files.push((".gitignore".into(), "target/\n*.wasm\n".into()));
            files.push(("ringmaster_policy.h".into(), C_SDK.to_owned()));
            files.push(("Makefile".into(), C_MAKEFILE.to_owned()));
        }
        Lang::Python => {
            let sample = match world {
                "safety-filter" => &PYTHON_SAFETY,
                "admission" => &PYTHON_ADMISSION,
                _ => &PYTHON_ROUTER,
            };
            for (path, text) in sample.files {
                files.push((path.into(), sample.as_project(text, name)));
            }
            files.push((".gitignore".into(), "__pycache__/\n*.wasm\n".into()));
            for (path, text) in PYTHON_SDK {
                files.push((Path::new("ringmaster_policy").join(path), text.to_owned()));
            }
        }
    }
    for (path, text) in &files {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(io_error(parent))?;
        }
        std::fs::write(&full, text).map_err(io_error(&full))?;
    }
    Ok(files.into_iter().map(|(path, _)| path).collect())
}

/// The README's lines for what only some worlds do: a router is replayed on a trace and
/// pushed as an A/B variant; the other worlds go into their own slot.
fn world_commands(name: &str, world: &str) -> String {
    let push = "RINGMASTER_ADMIN_TOKEN=... ringmaster policy push";
    if world == "router" {
        format!(
            "ringmaster policy test {name}.wasm --trace TRACE.jsonl --against \
             builtin:prefix-affinity\n{push} {name}.wasm --variant {name} --weight 10"
        )
    } else {
        format!("{push} {name}.wasm --slot {world}")
    }
}

/// A name that works as a crate name, a Python module's file name and a variant name.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(KitError::Project(format!(
            "{name:?}: a policy name is 1 to 64 lower-case letters, digits and `-`, starting \
             with a letter"
        )))
    }
}

/// What a project file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Project {
    /// The project's directory.
    pub dir: PathBuf,
    /// Its name (the component is `NAME.wasm`).
    pub name: String,
    /// Its language.
    pub lang: Lang,
    /// The world it targets.
    pub world: String,
    /// More directories Python modules are imported from (relative to the project), besides
    /// the project itself: for a project that uses an SDK it does not carry.
    pub python_path: Vec<PathBuf>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectFile {
    name: Option<String>,
    lang: Option<String>,
    world: Option<String>,
    #[serde(default)]
    python_path: Vec<PathBuf>,
}

impl Project {
    /// Reads `dir`'s project file; without one, a `Cargo.toml` makes it Rust and an `app.py`
    /// Python, named after the directory, targeting `router`.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(PROJECT_FILE);
        let file: ProjectFile = match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| KitError::Project(format!("{}: {}", path.display(), e.message())))?,
            Err(_) => ProjectFile {
                name: None,
                lang: None,
                world: None,
                python_path: Vec::new(),
            },
        };
        let lang = match file.lang.as_deref() {
            Some(lang) => Lang::parse(lang)?,
            None if dir.join("Cargo.toml").is_file() => Lang::Rust,
            None if dir.join("app.py").is_file() => Lang::Python,
            None if dir.join("app.js").is_file() => Lang::JavaScript,
            None if dir.join("app.c").is_file() => Lang::C,
            None => {
                return Err(KitError::Project(format!(
                    "{}: no {PROJECT_FILE}, Cargo.toml, app.py, app.js or app.c: not a policy project \
                     (make one with `ringmaster policy new NAME --lang rust|python|js|c`)",
                    dir.display()
                )));
            }
        };
        let name = file.name.unwrap_or_else(|| {
            dir.canonicalize()
                .ok()
                .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "policy".to_owned())
        });
        check_name(&name)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            name,
            lang,
            world: file.world.unwrap_or_else(|| "router".to_owned()),
            python_path: file.python_path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ringmaster-kit-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_project_names_what_it_is_and_carries_its_contract() {
        for lang in Lang::ALL {
            let dir = scratch(lang.as_str());
            let files = new_project(&dir, "my-router", lang, "router").unwrap();
            assert!(files.contains(&PathBuf::from("wit/policy.wit")));
            let project = Project::open(&dir).unwrap();
            assert_eq!(
                (project.name.as_str(), project.lang, project.world.as_str()),
                ("my-router", lang, "router")
            );
            let wit = std::fs::read_to_string(dir.join("wit/policy.wit")).unwrap();
            assert_eq!(wit, WIT);
            let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
            assert!(!readme.contains("{{"), "{readme}");
            assert!(
                readme.contains("policy test my-router.wasm")
                    && readme.contains("--variant my-router"),
                "{readme}"
            );
            // The sample's files name the new project, not the example they come from.
            for file in &files {
                let text = std::fs::read_to_string(dir.join(file)).unwrap();
                for example in [
                    "python-router",
                    "python-admission",
                    "python-safety",
                    "js-router",
                    "js-admission",
                    "js-safety",
                    "c-router",
                    "c-admission",
                    "c-safety",
                ] {
                    assert!(!text.contains(example), "{}: {example}", file.display());
                }
            }
            // A second scaffold into the same place is refused.
            let err = new_project(&dir, "my-router", lang, "router").unwrap_err();
            assert!(err.to_string().contains("not empty"), "{err}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn other_worlds_get_their_own_samples() {
        for (lang, world, marker) in [
            (Lang::Python, "admission", "def admit"),
            (Lang::JavaScript, "admission", "export function admit"),
            (Lang::C, "admission", "exports_admission_admit"),
            (Lang::Python, "safety-filter", "def check_input"),
            (Lang::Rust, "admission", "fn admit(req: &Request"),
            (Lang::Rust, "safety-filter", "fn check_input(text: String)"),
            (
                Lang::JavaScript,
                "safety-filter",
                "export function checkInput",
            ),
            (
                Lang::C,
                "safety-filter",
                "exports_safety_filter_check_input",
            ),
        ] {
            let dir = scratch(&format!("{lang}-{world}"));
            let files = new_project(&dir, "my-policy", lang, world).unwrap();
            let project = Project::open(&dir).unwrap();
            assert_eq!((project.lang, project.world.as_str()), (lang, world));
            let texts: String = files
                .iter()
                .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
                .collect();
            assert!(texts.contains(marker), "{lang} {world}");
            let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
            assert!(
                readme.contains(&format!("--slot {world}")) && !readme.contains("policy test"),
                "{readme}"
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn bad_names_languages_and_worlds_say_why() {
        let dir = scratch("bad");
        for name in ["", "My", "9lives", "a_b", "x/y"] {
            let err = new_project(&dir, name, Lang::Rust, "router").unwrap_err();
            assert!(err.to_string().contains("policy name"), "{name}: {err}");
        }
        assert!(
            Lang::parse("cobol")
                .unwrap_err()
                .to_string()
                .contains("rust, python, js, c")
        );
        let err = new_project(&dir, "ok", Lang::Python, "proxy").unwrap_err();
        assert!(err.to_string().contains("not a world"), "{err}");
        assert!(!dir.exists());
    }
}
