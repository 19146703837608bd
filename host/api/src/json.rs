//! Reading a request body: JSON into the door's wire type in one pass, with every problem
//! named for the client: bytes that are not UTF-8 or not JSON, a field the door does not
//! know, a value of the wrong type (with its path: `messages[2].content`).
//!
//! The wire types refuse unknown fields where Anthropic and OpenAI do, so a good body is read
//! by serde alone, borrowing its strings. Only a body that fails is read a second time, to
//! find the path of what failed (`serde_path_to_error`): the cost of naming it falls on the
//! bad request, not on every request.

use serde::Deserialize;

use crate::error::ApiError;

/// Parses `body` into `T`.
pub(crate) fn read<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
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
    serde_json::from_str(text).map_err(|e| {
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
    })
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
    fn a_failure_names_its_path_and_an_unknown_field_is_refused() {
        let err = read::<ringmaster_wire::anthropic::Request<'_>>(
            br#"{"model":"m","messages":[{"role":"user","content":"x","colour":1}]}"#,
        )
        .unwrap_err();
        assert!(
            err.message()
                .contains("messages[0].colour: unknown field `colour`"),
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
