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
//!
//! The fields only the gateway may set ([`FieldNotes::reserved`]: a split request's
//! orchestration, `kv_transfer_params`, SGLang's bootstrap, the workers' `ringmaster_*`; see
//! [`ringmaster_wire::reserved`]) are never passed on: every path drops and counts them, and
//! `refuse` refuses them like unknown fields.

use ringmaster_wire::reserved::is_reserved_field;

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
    /// Top-level fields only the gateway may set (`kv_transfer_params`): never passed on.
    pub reserved: Vec<String>,
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
        self.unknown.is_empty() && self.unused.is_empty() && self.reserved.is_empty()
    }

    /// Sorts the fields only the gateway may set out of the unknown ones, then refuses the
    /// first reserved or unknown field when the policy says so.
    pub fn settle(&mut self, policy: UnknownFields) -> Result<(), ApiError> {
        let (reserved, unknown): (Vec<String>, Vec<String>) = std::mem::take(&mut self.unknown)
            .into_iter()
            .partition(|path| is_reserved_field(path));
        self.unknown = unknown;
        for name in reserved {
            if !self.reserved.contains(&name) {
                self.reserved.push(name);
            }
        }
        if policy != UnknownFields::Refuse {
            return Ok(());
        }
        if let Some(name) = self.reserved.first() {
            return Err(ApiError::invalid(format!(
                "{name}: a field only the gateway sets (a split request's orchestration); this \
                 gateway refuses fields a client may not send: [api] unknown_fields = \"refuse\""
            )));
        }
        match self.unknown.first() {
            Some(path) => Err(ApiError::invalid(format!(
                "{path}: unknown field (this gateway refuses fields the API does not define: \
                 [api] unknown_fields = \"refuse\")"
            ))),
            None => Ok(()),
        }
    }

    /// What a body relayed as it came drops: the reserved fields always, the unknown ones
    /// too under `[api] unknown_fields = "drop"`, by path.
    pub fn relay_drops(&self, policy: UnknownFields) -> Vec<String> {
        let mut paths = self.reserved.clone();
        if policy == UnknownFields::Drop {
            paths.extend(self.unknown.iter().cloned());
        }
        paths
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
        for name in &self.reserved {
            add(name.clone());
        }
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
        assert!(notes.settle(UnknownFields::Pass).is_ok());
        let err = notes.settle(UnknownFields::Refuse).unwrap_err();
        assert!(
            err.message().starts_with("colour: unknown field"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn reserved_fields_are_sorted_out_dropped_on_every_path_and_refused_first() {
        let mut notes = FieldNotes {
            unknown: vec![
                "colour".into(),
                "kv_transfer_params".into(),
                "messages.0.kv_transfer_params".into(),
                "ringmaster_priority".into(),
            ],
            ..FieldNotes::default()
        };
        notes.settle(UnknownFields::Pass).unwrap();
        assert_eq!(
            notes.reserved,
            ["kv_transfer_params", "ringmaster_priority"]
        );
        // Only the top level is the gateway's: a nested field of that name is merely unknown.
        assert_eq!(notes.unknown, ["colour", "messages.0.kv_transfer_params"]);
        assert_eq!(
            notes.relay_drops(UnknownFields::Pass),
            ["kv_transfer_params", "ringmaster_priority"]
        );
        assert_eq!(notes.relay_drops(UnknownFields::Drop).len(), 4);
        assert!(
            notes
                .dropped(true)
                .starts_with(&["kv_transfer_params".into(), "ringmaster_priority".into()])
        );
        let err = notes.settle(UnknownFields::Refuse).unwrap_err();
        assert!(
            err.message()
                .starts_with("kv_transfer_params: a field only the gateway sets"),
            "{}",
            err.message()
        );
    }
}
