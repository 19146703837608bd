//! Turning a guest's core module into a component.
//!
//! Two rewrites happen on the core module before `wit-component` encodes it:
//!
//! - **Redundant world descriptions are dropped.** The SDK generates bindings for all three
//!   worlds, and `wit-bindgen` embeds each world's imports (a `component-type:…-with-all-of-
//!   its-exports-removed` custom section) into every policy that links the SDK, next to the
//!   complete description (`…:imports and exports`) that the policy's `export!` emits. The
//!   union would give every component the other worlds' type definitions as type imports, and
//!   would let a policy call an import its world does not have. So once a package has a
//!   complete description, its import-only ones go.
//! - **A start function can be set** (`start-function` under `[package.metadata.ringmaster]`):
//!   the named core export becomes the module's start function and stops being exported. Only
//!   the `trap-on-start` fixture uses it; Rust has no way to ask for one.

use crate::{KitError, Result};
use wasm_encoder::{CustomSection, ExportSection, Module, RawSection, StartSection};
use wasmparser::{Parser, Payload};

/// The custom-section prefix of `wit-bindgen`'s world descriptions.
const TYPE_SECTION_PREFIX: &str = "component-type:wit-bindgen:";
/// The name suffix of a world description without exports.
const IMPORTS_ONLY_SUFFIX: &str = "-with-all-of-its-exports-removed:encoded world";
/// The name suffix of the complete world description from `export!`.
const COMPLETE_SUFFIX: &str = ":imports and exports";

/// Whether `bytes` is already a component (as `wasm32-wasip2` builds are).
pub fn is_component(bytes: &[u8]) -> bool {
    wasmparser::Parser::is_component(bytes)
}

/// Rewrites a core module as described in the module docs, then encodes it as a component.
pub fn componentize(core: &[u8], start_function: Option<&str>) -> Result<Vec<u8>> {
    let module = rewrite_core(core, start_function)?;
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .map_err(|e| KitError::Wasm(format!("reading the module's component metadata: {e:#}")))?
        .encode()
        .map_err(|e| KitError::Wasm(format!("encoding the component: {e:#}")))
}

/// The package part of a `wit-bindgen` type section name, e.g. `ringmaster:policy@0.1.0`
/// (the name is `component-type:wit-bindgen:<version>:<package>:<world>:<suffix>`).
fn type_section_package(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(TYPE_SECTION_PREFIX)?;
    let (_, rest) = rest.split_once(':')?; // wit-bindgen's version
    let (rest, _) = rest.rsplit_once(':')?; // the suffix
    let (package, _) = rest.rsplit_once(':')?; // the world
    Some(package)
}

fn rewrite_core(core: &[u8], start_function: Option<&str>) -> Result<Vec<u8>> {
    // First pass: which packages have a complete world description.
    let mut complete_packages = Vec::new();
    for payload in Parser::new(0).parse_all(core) {
        if let Payload::CustomSection(section) = payload?
            && section.name().ends_with(COMPLETE_SUFFIX)
            && let Some(package) = type_section_package(section.name())
        {
            complete_packages.push(package.to_owned());
        }
    }

    let mut module = Module::new();
    let mut start_index = None;
    for payload in Parser::new(0).parse_all(core) {
        let payload = payload?;
        match &payload {
            // The code section is copied whole at `CodeSectionStart`.
            Payload::Version { .. } | Payload::End(_) | Payload::CodeSectionEntry(_) => {}
            Payload::CustomSection(section) => {
                let name = section.name();
                let redundant = name.ends_with(IMPORTS_ONLY_SUFFIX)
                    && type_section_package(name)
                        .is_some_and(|p| complete_packages.iter().any(|c| c == p));
                if !redundant {
                    module.section(&CustomSection {
                        name: name.into(),
                        data: section.data().into(),
                    });
                }
            }
            Payload::ExportSection(reader) if start_function.is_some() => {
                let mut exports = ExportSection::new();
                for export in reader.clone() {
                    let export = export?;
                    if Some(export.name) == start_function
                        && export.kind == wasmparser::ExternalKind::Func
                    {
                        start_index = Some(export.index);
                    } else {
                        exports.export(export.name, export.kind.into(), export.index);
                    }
                }
                module.section(&exports);
                if let Some(function_index) = start_index {
                    module.section(&StartSection { function_index });
                }
            }
            Payload::StartSection { .. } if start_function.is_some() => {
                return Err(KitError::Wasm(
                    "the module already has a start function".to_owned(),
                ));
            }
            other => match other.as_section() {
                Some((id, range)) => {
                    module.section(&RawSection {
                        id,
                        data: &core[range.start as usize..range.end as usize],
                    });
                }
                None => {
                    return Err(KitError::Wasm(format!(
                        "unexpected payload in a core module: {other:?}"
                    )));
                }
            },
        }
    }
    if let (Some(name), None) = (start_function, start_index) {
        return Err(KitError::Wasm(format!(
            "the module exports no function `{name}` to make its start function"
        )));
    }
    Ok(module.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_section_names_give_their_package() {
        assert_eq!(
            type_section_package(
                "component-type:wit-bindgen:0.61.1:ringmaster:policy@0.1.0:router:imports and exports"
            ),
            Some("ringmaster:policy@0.1.0")
        );
        assert_eq!(
            type_section_package(
                "component-type:wit-bindgen:0.61.1:ringmaster:policy@0.1.0:admission-with-all-of-its-exports-removed:encoded world"
            ),
            Some("ringmaster:policy@0.1.0")
        );
        assert_eq!(type_section_package("name"), None);
    }

    #[test]
    fn a_start_function_replaces_its_export() {
        let core = test_module();
        let out = rewrite_core(&core, Some("go")).unwrap();
        let mut start = None;
        let mut exports = Vec::new();
        let mut customs = Vec::new();
        for payload in Parser::new(0).parse_all(&out) {
            match payload.unwrap() {
                Payload::StartSection { func, .. } => start = Some(func),
                Payload::ExportSection(r) => {
                    exports = r.into_iter().map(|e| e.unwrap().name.to_owned()).collect()
                }
                Payload::CustomSection(c) => customs.push(c.name().to_owned()),
                _ => {}
            }
        }
        assert_eq!(start, Some(0));
        assert_eq!(exports, ["keep"]);
        assert_eq!(customs, ["c"]);
        wasmparser::Validator::new().validate_all(&out).unwrap();
        assert!(rewrite_core(&core, Some("missing")).is_err());
    }

    /// `(module (func (export "go") unreachable) (func (export "keep")) (@custom "c" "x"))`,
    /// assembled by hand.
    fn test_module() -> Vec<u8> {
        use wasm_encoder::{
            CodeSection, ExportKind, Function, FunctionSection, Instruction, TypeSection,
        };
        let mut module = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        module.section(&types);
        let mut funcs = FunctionSection::new();
        funcs.function(0);
        funcs.function(0);
        module.section(&funcs);
        let mut exports = ExportSection::new();
        exports.export("go", ExportKind::Func, 0);
        exports.export("keep", ExportKind::Func, 1);
        module.section(&exports);
        let mut code = CodeSection::new();
        let mut trap = Function::new([]);
        trap.instruction(&Instruction::Unreachable);
        trap.instruction(&Instruction::End);
        code.function(&trap);
        let mut empty = Function::new([]);
        empty.instruction(&Instruction::End);
        code.function(&empty);
        module.section(&code);
        module.section(&CustomSection {
            name: "c".into(),
            data: b"x".as_slice().into(),
        });
        module.finish()
    }
}
