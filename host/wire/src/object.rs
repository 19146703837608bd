//! A JSON object edited at its top level ([`TopLevel`], [`ObjectWriter`]): each value's JSON
//! text borrowed as it came, and the object written again with some values replaced, left
//! out or added. For bodies that pass through with a few fields changed (a client's body
//! relayed to a server of its API, a disaggregated request's two legs): nothing below the
//! top level is parsed or written again.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON object's top level: each key with its value's JSON text, in order.
#[derive(Debug)]
pub struct TopLevel<'a>(pub Vec<(String, &'a RawValue)>);

impl<'a> TopLevel<'a> {
    /// The object in `body` (an error for anything but a JSON object).
    pub fn parse(body: &'a [u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(body)
    }

    /// The JSON text of `key`'s value, when the object has it.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

impl<'de> serde::Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = TopLevel<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    entries.push(entry);
                }
                Ok(TopLevel(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// Writes a JSON object one field at a time, each value given as its JSON text.
#[derive(Debug)]
pub struct ObjectWriter {
    body: Vec<u8>,
    first: bool,
}

impl ObjectWriter {
    /// An object about `capacity` bytes long.
    pub fn with_capacity(capacity: usize) -> Self {
        let mut body = Vec::with_capacity(capacity);
        body.push(b'{');
        Self { body, first: true }
    }

    /// Adds `key` with `json`, a value's JSON text (written as it is).
    pub fn field(&mut self, key: &str, json: &str) {
        if !self.first {
            self.body.push(b',');
        }
        self.first = false;
        crate::sse::json_string(&mut self.body, key);
        self.body.push(b':');
        self.body.extend_from_slice(json.as_bytes());
    }

    /// The object's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.body.push(b'}');
        self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_pass_as_their_text_and_keys_keep_their_order() {
        let body = br#"{"z": [1, 2 ,3], "a":{"deep":"x\u00e9"},"m":null}"#;
        let top = TopLevel::parse(body).unwrap();
        assert_eq!(top.get("a").unwrap().get(), r#"{"deep":"x\u00e9"}"#);
        assert!(top.get("b").is_none());
        let mut out = ObjectWriter::with_capacity(body.len());
        for (key, value) in &top.0 {
            if key != "m" {
                out.field(key, value.get());
            }
        }
        out.field("added\"", "true");
        assert_eq!(
            String::from_utf8(out.finish()).unwrap(),
            r#"{"z":[1, 2 ,3],"a":{"deep":"x\u00e9"},"added\"":true}"#
        );
        assert!(TopLevel::parse(b"[1]").is_err());
        assert_eq!(ObjectWriter::with_capacity(0).finish(), b"{}");
    }
}
