//! The contract a component must keep to load: its header says it is a component, its world is
//! one of `ringmaster:policy`'s (`@0.2.0`, or `@0.1.0` still loading), it exports what the
//! world exports and imports nothing the host does not grant. Each [`World`] names its own.

use wasmtime::component::{Component, ComponentExportIndex, Instance};
use wasmtime::{Engine, Store};

use crate::error::PolicyError;
use crate::host::StoreData;

/// Refuses bytes that are not a component before handing them to the compiler, with a
/// message that says what they are instead.
pub(crate) fn check_header<W: World>(name: &str, bytes: &[u8]) -> Result<(), PolicyError> {
    const MAGIC: &[u8] = b"\0asm";
    const MODULE: [u8; 4] = [1, 0, 0, 0];
    const COMPONENT: [u8; 4] = [0x0d, 0, 1, 0];
    if bytes.len() < 8 || !bytes.starts_with(MAGIC) {
        return Err(PolicyError::NotAComponent(format!(
            "`{name}` is not WebAssembly ({} bytes that do not start with `\\0asm`): load a \
             component built for the {} world of ringmaster:policy@0.1.0",
            bytes.len(),
            W::NAME
        )));
    }
    match <[u8; 4]>::try_from(&bytes[4..8]) {
        Ok(MODULE) => Err(PolicyError::NotAComponent(format!(
            "`{name}` is a core WebAssembly module, not a component: turn it into one with \
             `wasm-tools component new` (or build it with the Ringmaster SDK) for the {} world",
            W::NAME
        ))),
        Ok(COMPONENT) => Ok(()),
        _ => Err(PolicyError::NotAComponent(format!(
            "`{name}` has an unknown WebAssembly version or layer ({:02x?}): expected a \
             component (0d 00 01 00)",
            &bytes[4..8]
        ))),
    }
}

/// Which `ringmaster:policy` contract a component was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// `0.1.0`: the request is a record, copied whole into every call.
    V0_1,
    /// `0.2.0`: the request is a resource with getters; `state` and `observe` exist.
    V0_2,
    /// `0.3.0`: a router may answer a pair; servers carry their role.
    V0_3,
}

impl Version {
    /// Whether the version has `state`, `observe` and the request resource (0.2.0 on).
    pub(crate) fn has_resources(self) -> bool {
        self != Self::V0_1
    }
}

impl Version {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::V0_1 => "0.1.0",
            Self::V0_2 => "0.2.0",
            Self::V0_3 => "0.3.0",
        }
    }
}

/// The contract version a component's `ringmaster:policy` imports name. A component that
/// imports none of them (a safety filter that logs nothing) has the same calls in both
/// versions and is called as 0.1.0.
pub(crate) fn contract_version(
    name: &str,
    component: &Component,
    engine: &Engine,
) -> Result<Version, PolicyError> {
    let ty = component.component_type();
    let mut seen: Vec<&str> = Vec::new();
    for (import, _) in ty.imports(engine) {
        if let Some(rest) = import.strip_prefix("ringmaster:policy/") {
            let version = rest.split_once('@').map_or("", |(_, v)| v);
            if !seen.contains(&version) {
                seen.push(version);
            }
        }
    }
    match seen.as_slice() {
        [] | ["0.1.0"] => Ok(Version::V0_1),
        ["0.2.0"] => Ok(Version::V0_2),
        ["0.3.0"] => Ok(Version::V0_3),
        [one] => Err(PolicyError::WrongWorld(format!(
            "`{name}` was built against ringmaster:policy@{one}, which this gateway does not \
             know (it loads 0.3.0, 0.2.0 and 0.1.0)",
            one = if one.is_empty() { "(no version)" } else { one }
        ))),
        many => Err(PolicyError::WrongWorld(format!(
            "`{name}` imports more than one version of ringmaster:policy ({}): build it against one",
            many.join(", ")
        ))),
    }
}

/// Checks the component's exports and imports against world `W` by name, so a mismatch gets
/// a message naming what is missing or extra (the linker then checks the types), and says
/// which contract version it targets.
pub(crate) fn check_world<W: World>(
    name: &str,
    component: &Component,
    engine: &Engine,
) -> Result<Version, PolicyError> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(n, _)| n).collect();
    let missing: Vec<&str> = W::EXPORTS
        .iter()
        .copied()
        .filter(|e| !exports.contains(e))
        .collect();
    if !missing.is_empty() {
        let guess = if exports.contains(&"route") {
            " (it looks like a router policy)"
        } else if exports.contains(&"admit") {
            " (it looks like an admission policy)"
        } else if exports.contains(&"check-input") {
            " (it looks like a safety-filter policy)"
        } else {
            ""
        };
        return Err(PolicyError::WrongWorld(format!(
            "`{name}` does not target the {} world: it does not export {}; it exports {}{guess}",
            W::NAME,
            quoted(&missing),
            if exports.is_empty() {
                "nothing".to_owned()
            } else {
                quoted(&exports)
            },
        )));
    }
    for (import, item) in ty.imports(engine) {
        if matches!(
            item.ty,
            wasmtime::component::types::ComponentItem::Type(_)
                | wasmtime::component::types::ComponentItem::Resource(_)
        ) {
            // A type the world `use`s at its top level (0.2.0's `request`) is imported as a
            // type: an alias of the interface's, which grants nothing.
            continue;
        }
        if import.starts_with("wasi:") {
            // WASI 0.2 is linked with nothing granted; an interface outside it (wasi:http...)
            // fails in the linker, which names it.
            continue;
        }
        let unversioned = import.split('@').next().unwrap_or(import);
        if !W::IMPORTS.contains(&unversioned) && unversioned != "ringmaster:policy/types" {
            return Err(PolicyError::WrongWorld(format!(
                "`{name}` imports `{import}`, which the host does not grant to a {} policy \
                 (it may import {} and WASI 0.2, which grants no files, network or environment)",
                W::NAME,
                quoted(W::IMPORTS),
            )));
        }
    }
    contract_version(name, component, engine)
}

pub(crate) fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the engine needs to know about a world to load and call its policies.
pub(crate) trait World: Sized + 'static {
    /// The world's name in `policy.wit`.
    const NAME: &'static str;
    /// The functions it must export.
    const EXPORTS: &'static [&'static str];
    /// The functions it may also export (0.2.0 only: `observe` for a learning router).
    const OPTIONAL_EXPORTS: &'static [&'static str] = &[];
    /// The `ringmaster:policy` interfaces it may import (unversioned).
    const IMPORTS: &'static [&'static str];
    /// Its typed exports, looked up once per instance.
    type Exports: Copy + Send + Sync + 'static;
    /// Looks up and type-checks the exports of a fresh instance of contract `version`.
    /// `indices` follow `EXPORTS`, then the `OPTIONAL_EXPORTS` that are present (`optional`
    /// says which: one flag per optional export).
    fn exports(
        instance: &Instance,
        store: &mut Store<StoreData>,
        version: Version,
        indices: &[ComponentExportIndex],
        optional: &[bool],
    ) -> wasmtime::Result<Self::Exports>;
}
