//! [`Str`]: a string field that borrows from the buffer it was read from.
//!
//! serde's own `Cow<str>` borrows only where a field is exactly `Cow<str>` with
//! `#[serde(borrow)]`; inside an `Option`, a `Vec` or an enum it always copies. `Str` borrows
//! wherever it sits, unless the text had escapes to undo, and writes back as a plain string,
//! so one type serves both directions: a reader that drops the text copies nothing, a writer
//! that builds a body from borrowed values copies nothing either.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A string that borrows where it can.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Str<'a>(pub Cow<'a, str>);

impl<'a> Str<'a> {
    /// The text, owned (a copy only when it was borrowed).
    pub fn into_owned(self) -> String {
        self.0.into_owned()
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the text was borrowed from the buffer (for tests of the no-copy path).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.0, Cow::Borrowed(_))
    }
}

impl fmt::Debug for Str<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Str<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl std::ops::Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'a> From<&'a str> for Str<'a> {
    fn from(text: &'a str) -> Self {
        Self(Cow::Borrowed(text))
    }
}

impl From<String> for Str<'_> {
    fn from(text: String) -> Self {
        Self(Cow::Owned(text))
    }
}

impl<'a> From<&'a String> for Str<'a> {
    fn from(text: &'a String) -> Self {
        Self(Cow::Borrowed(text.as_str()))
    }
}

impl PartialEq<str> for Str<'_> {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for Str<'_> {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl Serialize for Str<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Visit)
    }
}

/// Implements `Deserialize` for an enum of "a string, or a list of `T`" (OpenAI's `stop` and
/// message content, Anthropic's content and system prompt) without serde's `untagged`, which
/// reads the whole value into a buffer of its own first and so copies every string in it.
macro_rules! string_or_list {
    ($name:ident, $expecting:literal) => {
        impl<'de: 'a, 'a> serde::Deserialize<'de> for $name<'a> {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Visit;
                impl<'de> serde::de::Visitor<'de> for Visit {
                    type Value = $name<'de>;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                        Ok($name::Text($crate::Str(std::borrow::Cow::Borrowed(v))))
                    }
                    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                        Ok($name::Text($crate::Str(std::borrow::Cow::Owned(
                            v.to_owned(),
                        ))))
                    }
                    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                        Ok($name::Text($crate::Str(std::borrow::Cow::Owned(v))))
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        seq: A,
                    ) -> Result<Self::Value, A::Error> {
                        let items = serde::Deserialize::deserialize(
                            serde::de::value::SeqAccessDeserializer::new(seq),
                        )?;
                        Ok($name::List(items))
                    }
                }
                deserializer.deserialize_any(Visit)
            }
        }
    };
}
pub(crate) use string_or_list;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_and_escaped_text_is_unescaped() {
        let plain: Vec<Str<'_>> = serde_json::from_str(r#"["plain", "tab\tbed"]"#).unwrap();
        assert!(plain[0].is_borrowed());
        assert_eq!(plain[0], "plain");
        assert!(!plain[1].is_borrowed());
        assert_eq!(plain[1], "tab\tbed");
        let inside: Option<Str<'_>> = serde_json::from_str(r#""x""#).unwrap();
        assert!(inside.unwrap().is_borrowed());
        assert_eq!(
            serde_json::to_string(&Str::from("a\"b")).unwrap(),
            r#""a\"b""#
        );
    }
}
