//! What a door did not carry into the [`crate::Request`] it made, so that nothing is lost
//! unnoticed: the fields of a body that no API of the door defines ([`FieldNotes::unknown`],
//! found in the one parse), and the fields the API defines that this gateway does not use
//! ([`FieldNotes::unused`]: `context_management`, `cache_control`, hosted tools, …).
//!
//! Neither fails a request unless the operator asks for that (`[api] unknown_fields =
//! "refuse"`, for unknown fields only). A request relayed to a server that speaks the door's
//! own API keeps both (its body goes on as it came); a translated one drops both, and the
//! gateway counts each (`ringmaster_dropped_fields_total{door,field}`), logs it at debug and
//! names it in the `x-ringmaster-dropped` response header.

use crate::error::ApiError;

/// What becomes of a field the door's API does not define (`[api] unknown_fields`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownFields {
    /// Passed on to a server that speaks the door's API, dropped (and counted) otherwise.
    #[default]
    Pass,
    /// Always dropped (and counted).
    Drop,
    /// Refused: 400 naming the field.
    Refuse,
}

impl UnknownFields {
    /// From its name in the config: `pass`, `drop` or `refuse`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "pass" => Some(Self::Pass),
            "drop" => Some(Self::Drop),
            "refuse" => Some(Self::Refuse),
            _ => None,
        }
    }
}

/// The fields a door read over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldNotes {
    /// Paths of fields no API of the door defines (`messages.0.content.1.colour`).
    pub unknown: Vec<String>,
    /// Fields the API defines that the request does not carry, by name (`cache_control`,
    /// `tools.web_search`, `anthropic-beta`).
    pub unused: Vec<&'static str>,
    /// Where the request asks for reasoning (`thinking`, `reasoning_effort`, `reasoning`):
    /// dropped too on a server without reasoning.
    pub reasoning: Option<&'static str>,
}

impl FieldNotes {
    /// Notes a known field the request does not carry (once).
    pub fn unused(&mut self, name: &'static str) {
        if !self.unused.contains(&name) {
            self.unused.push(name);
        }
    }

    /// Whether anything was read over.
    pub fn is_empty(&self) -> bool {
        self.unknown.is_empty() && self.unused.is_empty()
    }

    /// Refuses the first unknown field when the policy says so.
    pub fn check(&self, policy: UnknownFields) -> Result<(), ApiError> {
        match (policy, self.unknown.first()) {
            (UnknownFields::Refuse, Some(path)) => Err(ApiError::invalid(format!(
                "{path}: unknown field (this gateway refuses fields the API does not define: \
                 [api] unknown_fields = \"refuse\")"
            ))),
            _ => Ok(()),
        }
    }

    /// What a translated request drops, by name (unknown paths without their indices:
    /// `messages.content.colour`), each once; the reasoning field too when the server has no
    /// reasoning.
    pub fn dropped(&self, server_reasons: bool) -> Vec<String> {
        let mut names: Vec<String> = Vec::with_capacity(self.unknown.len() + self.unused.len() + 1);
        let mut add = |name: String| {
            if !names.contains(&name) {
                names.push(name);
            }
        };
        for name in &self.unused {
            add((*name).to_owned());
        }
        if !server_reasons && let Some(field) = self.reasoning {
            add(field.to_owned());
        }
        for path in &self.unknown {
            add(without_indices(path));
        }
        names
    }
}

/// `messages.0.content.1.colour` → `messages.content.colour`.
pub fn without_indices(path: &str) -> String {
    path.split('.')
        .filter(|segment| segment.is_empty() || !segment.bytes().all(|b| b.is_ascii_digit()))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_names_are_unique_and_without_indices() {
        let mut notes = FieldNotes {
            unknown: vec![
                "colour".into(),
                "messages.0.content.1.shade".into(),
                "messages.3.content.0.shade".into(),
            ],
            ..FieldNotes::default()
        };
        notes.unused("cache_control");
        notes.unused("cache_control");
        notes.reasoning = Some("thinking");
        assert_eq!(
            notes.dropped(false),
            [
                "cache_control",
                "thinking",
                "colour",
                "messages.content.shade"
            ]
        );
        assert_eq!(
            notes.dropped(true),
            ["cache_control", "colour", "messages.content.shade"]
        );
        assert!(notes.check(UnknownFields::Pass).is_ok());
        let err = notes.check(UnknownFields::Refuse).unwrap_err();
        assert!(
            err.message().starts_with("colour: unknown field"),
            "{}",
            err.message()
        );
    }
}
