//! `[lora]`: LoRA adapters loaded on demand. The servers' own `/v1/models` says which adapters
//! each one holds (that needs no configuration); this section, opt-in, lets the gateway load a
//! requested adapter on the server it routes to when none with room holds it (vLLM's
//! `POST /v1/load_lora_adapter`, enabled there by `VLLM_ALLOW_RUNTIME_LORA_UPDATING`) and
//! unload the least recently used past `max_per_server`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::{ConfigError, invalid};

/// `[lora]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLora {
    /// Load a requested adapter where none with room holds it (default false).
    pub load_on_demand: Option<bool>,
    /// Adapters one server keeps loaded (default 4); past it the least recently used goes.
    pub max_per_server: Option<usize>,
    /// An adapter asked for within this many milliseconds is never unloaded (default
    /// 10000: its requests may still be running).
    pub busy_ms: Option<u64>,
    /// `[lora.adapters.NAME]`: where each adapter is and which model it adapts.
    pub adapters: Option<BTreeMap<String, RawAdapter>>,
}

/// `[lora.adapters.NAME]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdapter {
    /// The adapter's path as the server reads it (`lora_path`).
    pub path: Option<String>,
    /// The model it adapts (a name the servers serve).
    pub base: Option<String>,
}

/// One adapter the gateway may load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSource {
    /// `lora_path`, as the server reads it.
    pub path: String,
    /// The base model.
    pub base: String,
}

/// `[lora]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraSettings {
    /// Whether adapters are loaded on demand.
    pub load_on_demand: bool,
    /// Adapters one server keeps loaded.
    pub max_per_server: usize,
    /// An adapter asked for this recently is never unloaded.
    pub busy: std::time::Duration,
    /// The adapters, by the name requests use (and the server serves them under).
    pub adapters: BTreeMap<String, AdapterSource>,
}

impl Default for LoraSettings {
    fn default() -> Self {
        Self {
            load_on_demand: false,
            max_per_server: 4,
            busy: std::time::Duration::from_secs(10),
            adapters: BTreeMap::new(),
        }
    }
}

impl LoraSettings {
    /// The adapter `model` names, when it is one the gateway may load.
    pub fn loadable(&self, model: &str) -> Option<&AdapterSource> {
        if !self.load_on_demand {
            return None;
        }
        self.adapters.get(model)
    }
}

/// Validates `[lora]`.
pub(crate) fn lora_settings(raw: RawLora) -> Result<LoraSettings, ConfigError> {
    let d = LoraSettings::default();
    let max_per_server = raw.max_per_server.unwrap_or(d.max_per_server);
    if max_per_server == 0 {
        return Err(invalid("lora.max_per_server", "must be at least 1"));
    }
    let mut adapters = BTreeMap::new();
    for (name, adapter) in raw.adapters.unwrap_or_default() {
        let at = |key: &str| format!("lora.adapters.{name}.{key}");
        let path = adapter
            .path
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| invalid(at("path"), "required: the adapter's path on the servers"))?;
        let base = adapter
            .base
            .filter(|b| !b.trim().is_empty())
            .ok_or_else(|| invalid(at("base"), "required: the model the adapter adapts"))?;
        if base == name {
            return Err(invalid(
                at("base"),
                "an adapter cannot be its own base model",
            ));
        }
        adapters.insert(name, AdapterSource { path, base });
    }
    let load_on_demand = raw.load_on_demand.unwrap_or(false);
    if load_on_demand && adapters.is_empty() {
        return Err(invalid(
            "lora.load_on_demand",
            "name the adapters it may load under [lora.adapters.NAME] (path, base)",
        ));
    }
    Ok(LoraSettings {
        load_on_demand,
        max_per_server,
        busy: raw.busy_ms.map_or(d.busy, std::time::Duration::from_millis),
        adapters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LoraSettings, ConfigError> {
        lora_settings(toml::from_str(text).unwrap())
    }

    #[test]
    fn adapters_need_a_path_and_a_base() {
        let settings = parse(
            "load_on_demand = true\nmax_per_server = 2\n\
             [adapters.sql]\npath = \"/a/sql\"\nbase = \"llama\"\n",
        )
        .unwrap();
        assert_eq!(settings.max_per_server, 2);
        assert_eq!(
            settings.loadable("sql"),
            Some(&AdapterSource {
                path: "/a/sql".into(),
                base: "llama".into()
            })
        );
        assert_eq!(settings.loadable("llama"), None);
        for (bad, key) in [
            (
                "[adapters.sql]\nbase = \"llama\"\n",
                "lora.adapters.sql.path",
            ),
            ("[adapters.sql]\npath = \"/a\"\n", "lora.adapters.sql.base"),
            (
                "[adapters.sql]\npath = \"/a\"\nbase = \"sql\"\n",
                "lora.adapters.sql.base",
            ),
            ("max_per_server = 0\n", "lora.max_per_server"),
            ("load_on_demand = true\n", "lora.load_on_demand"),
        ] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(error.contains(key), "{bad}: {error}");
        }
    }

    #[test]
    fn without_load_on_demand_nothing_is_loadable() {
        let settings = parse("[adapters.sql]\npath = \"/a/sql\"\nbase = \"llama\"\n").unwrap();
        assert_eq!(settings.loadable("sql"), None);
    }
}
