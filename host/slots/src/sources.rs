//! Where the slots' policies and the policy engine's settings come from: a component's bytes
//! from its configured source (a built-in or a file), and the engine's settings from
//! `[policies]`.

use ringmaster_config::PolicySource;
use ringmaster_policy_engine::builtin;

/// The component bytes of a policy source.
pub fn policy_bytes(source: &PolicySource) -> std::io::Result<Vec<u8>> {
    match source {
        PolicySource::Builtin(name) => {
            builtin::builtin(name).map(<[u8]>::to_vec).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "no built-in policy {name:?}; built-ins: {}",
                        builtin::builtin_names()
                    ),
                )
            })
        }
        PolicySource::File(path) => std::fs::read(path),
    }
}

/// The policy engine's settings: its defaults with `[policies]`' limits over them.
pub fn policy_engine_config(
    settings: &ringmaster_config::PolicyEngineSettings,
) -> ringmaster_policy_engine::EngineConfig {
    let mut engine = ringmaster_policy_engine::EngineConfig::default();
    let s = settings;
    engine.call_deadline = s.call_deadline.unwrap_or(engine.call_deadline);
    engine.memory_limit_bytes = s.memory_limit_bytes.unwrap_or(engine.memory_limit_bytes);
    engine.state_max_entries = s.state_max_entries.unwrap_or(engine.state_max_entries);
    engine.state_max_bytes = s.state_max_bytes.unwrap_or(engine.state_max_bytes);
    engine.cache_dir = match &s.cache {
        ringmaster_config::ComponentCache::UserCache => {
            ringmaster_policy_engine::default_cache_dir()
        }
        ringmaster_config::ComponentCache::Dir(dir) => Some(dir.clone()),
        ringmaster_config::ComponentCache::Off => None,
    };
    engine
}

#[cfg(test)]
mod tests {
    use ringmaster_policy_engine::builtin;

    #[test]
    fn the_config_names_the_built_ins_the_engine_embeds() {
        let embedded: Vec<&str> = builtin::BUILTIN_POLICIES
            .iter()
            .map(|(name, _)| *name)
            .collect();
        let named: Vec<&str> = ringmaster_config::policies::BUILTIN_POLICIES
            .iter()
            .map(|(name, _)| *name)
            .collect();
        assert_eq!(
            embedded, named,
            "a built-in was added or renamed: update ringmaster_config::policies::BUILTIN_POLICIES"
        );
    }

    /// The slot the configuration gives each built-in is the one its component loads into:
    /// the configuration's check (`check-config` and `serve` alike) refuses a built-in in
    /// another slot's place on that word alone.
    #[test]
    fn each_built_in_loads_into_the_slot_the_config_gives_it() {
        use ringmaster_config::policies::SlotKind;
        let engine =
            ringmaster_policy_engine::PolicyEngine::new(ringmaster_policy_engine::EngineConfig {
                cache_dir: None,
                ..Default::default()
            })
            .unwrap();
        for (name, slot) in ringmaster_config::policies::BUILTIN_POLICIES {
            let bytes = builtin::builtin(name).unwrap();
            let config = std::collections::BTreeMap::new();
            let loaded = match slot {
                SlotKind::Router => engine.load_router(name, bytes, config).map(drop),
                SlotKind::Admission => engine.load_admission(name, bytes, config).map(drop),
                SlotKind::Safety => engine.load_safety(name, bytes, config).map(drop),
            };
            assert!(
                loaded.is_ok(),
                "builtin:{name} does not load as {}: {:?}",
                slot.as_str(),
                loaded.err()
            );
        }
    }

    #[test]
    fn no_policy_setting_is_the_engines_default() {
        let expected = ringmaster_policy_engine::EngineConfig {
            cache_dir: ringmaster_policy_engine::default_cache_dir(),
            ..Default::default()
        };
        assert_eq!(super::policy_engine_config(&Default::default()), expected);
    }
}
