//! Reading a request body: JSON into the door's wire type in one pass, with every problem
//! named for the client: bytes that are not UTF-8 or not JSON, a value of the wrong type (with
//! its path: `messages[2].content`), and fields the door does not know.
//!
//! The wire types read leniently (the worker and the pool's client read the same types and
//! ignore what they do not know); a door is strict where Anthropic and OpenAI are: an unknown
//! field at the top level, in a message or in the door's other fixed objects is refused,
//! found in the same pass (`serde_ignored`), while loose objects (content blocks, tools) keep
//! fields this gateway has no use for.

use serde::Deserialize;

use crate::error::ApiError;

/// Where a door refuses unknown fields: the top level, and the objects named here (each by
/// its path with list indices dropped, `messages` for any message).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strict(pub &'static [&'static str]);

/// Parses `body` into `T`; unknown fields where `strict` says so are refused.
pub(crate) fn read<'a, T: Deserialize<'a>>(body: &'a [u8], strict: Strict) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            "request body is empty; expected a JSON object",
        ));
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::invalid(format!(
            "request body is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    let mut unknown: Option<String> = None;
    let mut json = serde_json::Deserializer::from_str(text);
    let mut track = serde_path_to_error::Track::new();
    let value = {
        let tracked = serde_path_to_error::Deserializer::new(&mut json, &mut track);
        serde_ignored::deserialize(tracked, |path| {
            if unknown.is_none() {
                let path = path.to_string();
                if is_strict(&path, strict) {
                    unknown = Some(path);
                }
            }
        })
    };
    let value = value.and_then(|value| json.end().map(|()| value));
    let value: T = value.map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "request body is not valid JSON"
            }
            _ => "request body does not match the expected schema",
        };
        let path = track.path().to_string();
        if path.is_empty() || path == "." {
            ApiError::invalid(format!("{what}: {e}"))
        } else {
            ApiError::invalid(format!("{what}: {path}: {e}"))
        }
    })?;
    if let Some(path) = unknown {
        let (at, field) = match path.rsplit_once('.') {
            Some((at, field)) => (Some(at), field),
            None => (None, path.as_str()),
        };
        return Err(ApiError::invalid(match at {
            Some(at) => format!(
                "request body does not match the expected schema: {at}: unknown field `{field}`"
            ),
            None => {
                format!("request body does not match the expected schema: unknown field `{field}`")
            }
        }));
    }
    Ok(value)
}

/// Parses a JSON body into `T`, naming every problem for the client (for bodies that are no
/// door's: the admin API's). Unknown fields are refused at the top level.
pub fn read_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    read(body, Strict(&[]))
}

/// Whether an unknown field at `path` (`serde_ignored`'s form: `messages.?.0.name`) is in a
/// strict object.
fn is_strict(path: &str, strict: Strict) -> bool {
    // The object's path: the field's parents, without `?` (an Option) and list indices.
    let parents: Vec<&str> = path
        .split('.')
        .filter(|segment| *segment != "?" && segment.parse::<usize>().is_err())
        .collect();
    match parents.split_last() {
        None | Some((_, [])) => true,
        Some((_, parents)) => strict.0.contains(&parents.join(".").as_str()),
    }
}

/// Whether a JSON value says nothing: absent, `null`, `false`, `0`, `""`, `[]` or `{}`.
pub(crate) fn is_empty(value: Option<&serde_json::Value>) -> bool {
    use serde_json::Value;
    match value {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictness_follows_the_object_path() {
        let strict = Strict(&["messages", "metadata"]);
        assert!(is_strict("colour", strict));
        assert!(is_strict("messages.?.0.colour", strict));
        assert!(is_strict("metadata.?.colour", strict));
        assert!(!is_strict("messages.?.0.content.?.1.colour", strict));
        assert!(!is_strict("tools.?.0.colour", strict));
    }
}
