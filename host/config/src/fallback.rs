//! `[[fallback]]`: the spill-over pools. A model's requests go to a named pool of other
//! servers (a hosted provider over TLS, a reserve fleet) when its own servers cannot take
//! them; the servers of such a pool (`[[servers]] pool = "NAME"`) take nothing else. Plain
//! validated values; the gateway decides when a request spills.

use crate::{ConfigError, invalid};

/// Why a request spills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpillReason {
    /// No server of the model's pool can be reached (none serves it now, all drained, all
    /// down).
    NoServer,
    /// Every server of the model's pool has a full queue.
    Overloaded,
    /// The router policy declined the request.
    Policy,
}

impl SpillReason {
    /// Every reason, in the order the configuration documents them.
    pub const ALL: [Self; 3] = [Self::NoServer, Self::Overloaded, Self::Policy];

    /// Its name in the configuration and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoServer => "no_server",
            Self::Overloaded => "overloaded",
            Self::Policy => "policy",
        }
    }
}

/// One validated `[[fallback]]` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallbackRule {
    /// The spill-over pool's name.
    pub pool: String,
    /// The models it covers (`None`: every model).
    pub models: Option<Vec<String>>,
    /// The name its servers serve them under (`None`: the request's own).
    pub model: Option<String>,
    /// The reasons it takes requests for.
    pub when: Vec<SpillReason>,
}

impl FallbackRule {
    /// Whether it covers requests for `model` (the name served) spilling for `reason`.
    pub fn covers(&self, model: &str, reason: SpillReason) -> bool {
        self.when.contains(&reason)
            && self
                .models
                .as_ref()
                .is_none_or(|models| models.iter().any(|m| m == model))
    }
}

/// Checks a pool's name (`[[servers]] pool`, `[[fallback]] pool`).
pub(crate) fn pool_name(field: &str, name: &str) -> Result<String, String> {
    let name = name.trim();
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!(
            "{field} {name:?}: 1–64 ASCII letters, digits, '-', '_' or '.'"
        ));
    }
    Ok(name.to_owned())
}

/// Validates the `[[fallback]]` rules. The first rule that covers a request is the one used.
pub(crate) fn fallback(raw: Vec<crate::RawFallback>) -> Result<Vec<FallbackRule>, ConfigError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, raw)| {
            let at = format!("fallback[{i}]");
            let pool = pool_name("pool", &raw.pool).map_err(|why| invalid(&at, why))?;
            if raw
                .models
                .as_ref()
                .is_some_and(|m| m.is_empty() || m.iter().any(|m| m.trim().is_empty()))
            {
                return Err(invalid(
                    format!("{at}.models"),
                    "list at least one model, or leave it out for every model",
                ));
            }
            if raw.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
                return Err(invalid(format!("{at}.model"), "must not be empty"));
            }
            let when = match raw.when {
                None => SpillReason::ALL.to_vec(),
                Some(names) if names.is_empty() => {
                    return Err(invalid(format!("{at}.when"), "name at least one reason"));
                }
                Some(names) => names
                    .iter()
                    .map(|name| {
                        SpillReason::ALL
                            .into_iter()
                            .find(|r| r.as_str() == name.trim())
                            .ok_or_else(|| {
                                invalid(
                                    format!("{at}.when"),
                                    format!("{name:?} is not one of no_server, overloaded, policy"),
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?,
            };
            Ok(FallbackRule {
                pool,
                models: raw.models,
                model: raw.model.map(|m| m.trim().to_owned()),
                when,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_covers_its_models_and_reasons_only() {
        let rules = fallback(vec![
            crate::RawFallback {
                pool: "reserve".into(),
                models: Some(vec!["llama".into()]),
                model: None,
                when: Some(vec!["overloaded".into()]),
            },
            crate::RawFallback {
                pool: " hosted ".into(),
                model: Some("gpt-4o-mini".into()),
                ..Default::default()
            },
        ])
        .unwrap();
        assert!(rules[0].covers("llama", SpillReason::Overloaded));
        assert!(!rules[0].covers("llama", SpillReason::NoServer));
        assert!(!rules[0].covers("qwen", SpillReason::Overloaded));
        assert_eq!(rules[1].pool, "hosted");
        assert_eq!(rules[1].when, SpillReason::ALL.to_vec());
        for reason in SpillReason::ALL {
            assert!(rules[1].covers("anything", reason));
        }
    }
}
