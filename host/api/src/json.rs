//! Reading a request body: JSON into the door's wire type in one pass, with every problem
//! named for the client: bytes that are not UTF-8 or not JSON, a field the door does not
//! know, a value of the wrong type (with its path: `messages[2].content`).
//!
//! A good body is read by serde alone, borrowing its strings, in one pass that also notes
//! every field the wire type does not know ([`read_tracked`], through `serde_ignored`): the
//! door decides what becomes of them (`[api] unknown_fields`). Only a body that fails is read
//! a second time, to find the path of what failed (`serde_path_to_error`): the cost of naming
//! it falls on the bad request, not on every request.

use serde::Deserialize;

use crate::error::ApiError;

/// Most unknown fields noted per body: a body with more is no client's, and the rest are
/// dropped unnamed.
pub const MAX_UNKNOWN_FIELDS: usize = 64;

/// Parses `body` into `T`, with the path of every field `T` does not know
/// (`messages.0.content.1.colour`), at most [`MAX_UNKNOWN_FIELDS`] of them, and every
/// top-level field only the gateway may set whatever the count (a body cannot hide one behind
/// 64 others).
pub(crate) fn read_tracked<'a, T: Deserialize<'a>>(
    body: &'a [u8],
) -> Result<(T, Vec<String>), ApiError> {
    let text = utf8(body)?;
    let mut unknown = Vec::new();
    let mut json = serde_json::Deserializer::from_str(text);
    let value = serde_ignored::deserialize(&mut json, |path| {
        let reserved = matches!(
            &path,
            serde_ignored::Path::Map { parent: serde_ignored::Path::Root, key }
                if ringmaster_wire::reserved::is_reserved_field(key)
        );
        if unknown.len() < MAX_UNKNOWN_FIELDS || reserved {
            unknown.push(path_text(&path));
        }
    })
    .and_then(|value| json.end().map(|()| value))
    .map_err(|e| schema_error::<T>(text, &e))?;
    Ok((value, unknown))
}

/// `path` as dotted segments (`tools.3.cache_control`).
fn path_text(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    fn walk(path: &Path<'_>, out: &mut String) {
        let segment = match path {
            Path::Root => return,
            Path::Seq { parent, index } => {
                walk(parent, out);
                index.to_string()
            }
            Path::Map { parent, key } => {
                walk(parent, out);
                key.clone()
            }
            Path::Some { parent }
            | Path::NewtypeStruct { parent }
            | Path::NewtypeVariant { parent } => return walk(parent, out),
        };
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(&segment);
    }
    let mut out = String::new();
    walk(path, &mut out);
    out
}

fn utf8(body: &[u8]) -> Result<&str, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            "request body is empty; expected a JSON object",
        ));
    }
    std::str::from_utf8(body).map_err(|e| {
        ApiError::invalid(format!(
            "request body is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })
}

fn schema_error<'a, T: Deserialize<'a>>(text: &'a str, e: &serde_json::Error) -> ApiError {
    let what = match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            "request body is not valid JSON"
        }
        _ => "request body does not match the expected schema",
    };
    match failing_path::<T>(text) {
        Some(path) => ApiError::invalid(format!("{what}: {path}: {e}")),
        None => ApiError::invalid(format!("{what}: {e}")),
    }
}

/// Parses `body` into `T`.
pub(crate) fn read<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let text = utf8(body)?;
    serde_json::from_str(text).map_err(|e| schema_error::<T>(text, &e))
}

/// Where in `text` reading a `T` fails, when it is inside the top-level object.
fn failing_path<'a, T: Deserialize<'a>>(text: &'a str) -> Option<String> {
    let mut json = serde_json::Deserializer::from_str(text);
    let error = serde_path_to_error::deserialize::<_, T>(&mut json).err()?;
    let path = error.path().to_string();
    (!path.is_empty() && path != ".").then_some(path)
}

/// Parses a JSON body into `T`, naming every problem for the client (for bodies that are no
/// door's: the admin API's).
pub fn read_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    read(body)
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
    fn a_failure_names_its_path_and_unknown_fields_are_noted_by_path() {
        let (_, unknown) = read_tracked::<ringmaster_wire::anthropic::Request<'_>>(
            br#"{"model":"m","colour":{"a":1},"messages":[{"role":"user","content":[{"type":"text","text":"x","shade":1}]}]}"#,
        )
        .unwrap();
        assert_eq!(unknown, ["colour", "messages.0.content.0.shade"]);
        let err = read_tracked::<ringmaster_wire::anthropic::Request<'_>>(
            br#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
        )
        .unwrap_err();
        assert!(
            err.message().contains("messages[0].content: invalid type"),
            "{}",
            err.message()
        );
        let err = read_tracked::<ringmaster_wire::anthropic::Request<'_>>(br#"{"model":"m"} x"#)
            .unwrap_err();
        assert!(
            err.message().starts_with("request body is not valid JSON"),
            "{}",
            err.message()
        );
        let err =
            read::<ringmaster_wire::anthropic::Request<'_>>(br#"{"model":"m","max_tokens":"ten"}"#)
                .unwrap_err();
        assert!(
            err.message().contains("max_tokens: invalid type"),
            "{}",
            err.message()
        );
        // Loose objects keep what they do not know.
        assert!(
            read::<ringmaster_wire::anthropic::Request<'_>>(
                br#"{"messages":[{"role":"user","content":[{"type":"text","text":"x","citations":[]}]}]}"#
            )
            .is_ok()
        );
    }
}
