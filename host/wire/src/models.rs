//! `GET /v1/models`: one list both SDKs read (Anthropic's `has_more`/`first_id`/`last_id`
//! beside OpenAI's `object`; each SDK ignores the other's fields), and the pool reads any
//! server's list with (it needs only the ids).

use serde::{Deserialize, Serialize};

use crate::Str;

/// One model, in both APIs' fields (on the way in, only `id` is required).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model<'a> {
    /// `model` (Anthropic).
    #[serde(rename = "type", default, borrow)]
    pub kind: Str<'a>,
    /// Its name.
    #[serde(borrow)]
    pub id: Str<'a>,
    /// Its name, for people (Anthropic).
    #[serde(default, borrow)]
    pub display_name: Str<'a>,
    /// RFC 3339 (Anthropic).
    #[serde(default, borrow)]
    pub created_at: Str<'a>,
    /// `model` (OpenAI).
    #[serde(default, borrow)]
    pub object: Str<'a>,
    /// Seconds since the Unix epoch (OpenAI).
    #[serde(default)]
    pub created: u64,
    /// Who serves it (OpenAI).
    #[serde(default, borrow)]
    pub owned_by: Str<'a>,
    /// The base model of a LoRA adapter (vLLM lists each loaded adapter as a model with its
    /// base as `parent`; a base model has none).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Str<'a>>,
}

impl<'a> Model<'a> {
    /// The entry of the model `id`, served by `owner`.
    pub fn new(id: &'a str, owner: &'a str) -> Self {
        Self {
            kind: "model".into(),
            id: id.into(),
            display_name: id.into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            object: "model".into(),
            created: 1_767_225_600,
            owned_by: owner.into(),
            parent: None,
        }
    }
}

/// The list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList<'a> {
    /// `list` (OpenAI).
    #[serde(default, borrow)]
    pub object: Str<'a>,
    /// The models.
    #[serde(default, borrow)]
    pub data: Vec<Model<'a>>,
    /// Always `false`: one page (Anthropic).
    #[serde(default)]
    pub has_more: bool,
    /// The first model's id (Anthropic).
    #[serde(default, borrow)]
    pub first_id: Option<Str<'a>>,
    /// The last model's id (Anthropic).
    #[serde(default, borrow)]
    pub last_id: Option<Str<'a>>,
}

impl<'a> ModelList<'a> {
    /// The list of `models`, served by `owner`.
    pub fn new(models: &'a [String], owner: &'a str) -> Self {
        Self {
            object: "list".into(),
            data: models.iter().map(|m| Model::new(m, owner)).collect(),
            has_more: false,
            first_id: models.first().map(Str::from),
            last_id: models.last().map(Str::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_servers_list_reads_for_its_ids() {
        let listed: ModelList<'_> = serde_json::from_str(
            r#"{"object":"list","data":[{"id":"m","object":"model","root":"m"}]}"#,
        )
        .unwrap();
        assert_eq!(listed.data[0].id, "m");
        let ours = serde_json::to_value(ModelList::new(&["a".to_owned()], "ringmaster")).unwrap();
        assert_eq!(ours["data"][0]["display_name"], "a");
        assert_eq!(ours["first_id"], "a");
        assert!(
            ours["data"][0].get("parent").is_none(),
            "a base model has none"
        );
    }

    #[test]
    fn vllm_s_adapters_read_with_their_parent() {
        let listed: ModelList<'_> = serde_json::from_str(
            r#"{"object":"list","data":[
                {"id":"base","object":"model","root":"/models/base","parent":null},
                {"id":"sql","object":"model","root":"/adapters/sql","parent":"base"}]}"#,
        )
        .unwrap();
        assert_eq!(listed.data[0].parent, None);
        assert_eq!(listed.data[1].parent.as_deref(), Some("base"));
    }
}
