//! [`Skipped`]: a field the API defines and the reader does not use, read over without
//! copying anything (serde's `IgnoredAny` does the same, but a reader that collects the
//! fields it does not know, through `serde_ignored`, would count every `IgnoredAny` among
//! them: `Skipped` is a value it reads, so only fields nobody defines are counted).

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A value that was there, and nothing else about it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped;

impl<'de> Deserialize<'de> for Skipped {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Skip)
    }
}

struct Skip;

impl<'de> Visitor<'de> for Skip {
    type Value = Skipped;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_unit<E>(self) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_none<E>(self) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Skipped, D::Error> {
        Skipped::deserialize(deserializer)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skipped, A::Error> {
        while seq.next_element::<Skipped>()?.is_some() {}
        Ok(Skipped)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skipped, A::Error> {
        while map.next_entry::<Skipped, Skipped>()?.is_some() {}
        Ok(Skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_value_is_skipped_whole() {
        #[derive(serde::Deserialize)]
        struct Known {
            #[serde(default)]
            a: Option<Skipped>,
            #[serde(default)]
            b: Option<Skipped>,
        }
        let known: Known =
            serde_json::from_str(r#"{"a":{"x":[1,{"y":"z"}],"w":null},"b":2.5}"#).unwrap();
        assert_eq!((known.a, known.b), (Some(Skipped), Some(Skipped)));
    }
}
