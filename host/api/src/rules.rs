//! The rules both doors share, written once with the door's field names passed in: tools
//! offered and chosen, images, refused features, `max_tokens` and the other limits, the model
//! being served, stop sequences and session ids.

use ringmaster_wire::Str;
use ringmaster_wire::chat::{Effort, Image, ToolChoice, ToolOffer, ToolSpec};
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::request::{Clamped, Limits, MAX_SESSION_CHARS};

/// The 400 for a field this gateway knows but does not serve: it names the field and the
/// feature, never calls it unknown.
pub(crate) fn refused(field: &str, feature: &str) -> ApiError {
    ApiError::invalid(format!(
        "{field}: {feature} is not supported by this gateway yet (the field is known, the feature \
         is not served); leave it out"
    ))
}

/// `model`: not empty, and served here.
pub(crate) fn served_model(model: Option<Str<'_>>, limits: Limits<'_>) -> Result<String, ApiError> {
    let Some(model) = model else {
        return Err(ApiError::invalid("model: field required"));
    };
    if model.trim().is_empty() {
        return Err(ApiError::invalid("model: must not be empty"));
    }
    if !limits.models.iter().any(|m| *m == *model) {
        return Err(ApiError::not_found(format!(
            "model: {:?} is not served here; available models: {}",
            &*model,
            limits.models.join(", ")
        )));
    }
    Ok(model.into_owned())
}

/// `n` as a `max_tokens` (named `field`): at least 1; above the gateway's limit, the limit,
/// with the [`Clamped`] that says so. Agents ask for what their own model could write (Claude
/// Code 32,000 to 128,000 tokens, whatever model serves it): a reply is cut at the gateway's
/// limit instead of refused, as a server cuts it at its context's end.
pub(crate) fn max_tokens(
    n: i64,
    field: &'static str,
    limits: Limits<'_>,
) -> Result<(u32, Option<Clamped>), ApiError> {
    if n < 1 {
        return Err(ApiError::invalid(format!(
            "{field}: must be at least 1, got {n}"
        )));
    }
    let served = limits.max_output_tokens;
    Ok(match u32::try_from(n) {
        Ok(n) if n <= served => (n, None),
        _ => (
            served,
            Some(Clamped {
                field,
                asked: n.unsigned_abs(),
                served,
            }),
        ),
    })
}

/// A sampling value in `[0 or above 0, max]`.
pub(crate) fn in_range(
    value: Option<f64>,
    field: &str,
    zero_ok: bool,
    max: f64,
) -> Result<Option<f32>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v.is_finite() && v <= max && (v > 0.0 || (zero_ok && v == 0.0)) => {
            Ok(Some(v as f32))
        }
        Some(v) => Err(ApiError::invalid(format!(
            "{field}: must be {} 0 and at most {max}, got {v}",
            if zero_ok { "at least" } else { "greater than" }
        ))),
    }
}

/// vLLM's and SGLang's `top_k` (`-1` and `0` are off), as a cut-off.
pub(crate) fn openai_top_k(k: Option<i64>) -> Result<Option<u32>, ApiError> {
    match k {
        None | Some(-1 | 0) => Ok(None),
        Some(k) if k < 0 => Err(ApiError::invalid(format!(
            "top_k: must be -1 (off) or positive, got {k}"
        ))),
        Some(k) => u32::try_from(k)
            .map(Some)
            .map_err(|_| ApiError::invalid(format!("top_k: {k} is too large"))),
    }
}

/// A reasoning effort's name (at `field`): OpenAI's (`none` … `xhigh`) or Anthropic's
/// (`low` … `max`).
pub(crate) fn effort(name: Option<&str>, field: &str) -> Result<Option<Effort>, ApiError> {
    match name {
        None => Ok(None),
        Some(name) => Effort::parse(name).map(Some).ok_or_else(|| {
            ApiError::invalid(format!(
                "{field}: {name:?} is not one of \"none\", \"minimal\", \"low\", \"medium\", \
                 \"high\", \"xhigh\", \"max\""
            ))
        }),
    }
}

/// Stop sequences (named `field`), none empty.
pub(crate) fn stop_sequences(list: Vec<Str<'_>>, field: &str) -> Result<Vec<String>, ApiError> {
    if let Some(i) = list.iter().position(|s| s.is_empty()) {
        return Err(ApiError::invalid(format!("{field}.{i}: must not be empty")));
    }
    Ok(list.into_iter().map(Str::into_owned).collect())
}

/// A session id from the body (named `field`): empty is none, longer than
/// [`MAX_SESSION_CHARS`] is refused.
pub(crate) fn session(id: Option<Str<'_>>, field: &str) -> Result<Option<String>, ApiError> {
    match id {
        Some(id) if id.chars().count() > MAX_SESSION_CHARS => Err(ApiError::invalid(format!(
            "{field}: longer than {MAX_SESSION_CHARS} characters"
        ))),
        Some(id) if !id.is_empty() => Ok(Some(id.into_owned())),
        _ => Ok(None),
    }
}

/// A tool's spec (at `at`, its schema named `schema_field`): a non-empty name, a schema that
/// is a JSON object (`default_schema` when none is given, else it is required).
pub(crate) fn tool_spec(
    at: &str,
    name: Option<Str<'_>>,
    description: Option<Str<'_>>,
    (schema_field, schema, default_schema): (&str, Option<&RawValue>, Option<&str>),
) -> Result<ToolSpec, ApiError> {
    let name = match name {
        Some(name) if !name.is_empty() => name.into_owned(),
        _ => {
            return Err(ApiError::invalid(format!(
                "{at}.name: field required (a non-empty string)"
            )));
        }
    };
    let parameters = match (schema, default_schema) {
        (Some(schema), _) if is_object(schema) => schema.to_owned(),
        (Some(schema), Some(_)) if schema.get() == "null" => default_raw(default_schema),
        (None, Some(_)) => default_raw(default_schema),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(format!(
                "{at}.{schema_field}: must be a JSON schema object"
            )));
        }
        (_, None) => {
            return Err(ApiError::invalid(format!(
                "{at}.{schema_field}: field required (a JSON schema object)"
            )));
        }
    };
    Ok(ToolSpec {
        name,
        description: description.map(Str::into_owned),
        parameters,
    })
}

fn default_raw(schema: Option<&str>) -> Box<RawValue> {
    RawValue::from_string(schema.unwrap_or("{}").to_owned())
        .unwrap_or_else(|_| RawValue::from_string("{}".to_owned()).unwrap_or_default())
}

/// Whether JSON text is an object.
pub(crate) fn is_object(raw: &RawValue) -> bool {
    raw.get().trim_start().starts_with('{')
}

/// The tool named by a choice (at `field`): one of the tools offered.
pub(crate) fn named_tool(
    name: Option<Str<'_>>,
    specs: &[ToolSpec],
    field: &str,
    what: &str,
) -> Result<ToolChoice, ApiError> {
    match name {
        Some(name) if specs.iter().any(|t| t.name == *name) => {
            Ok(ToolChoice::Named(name.into_owned()))
        }
        Some(name) => Err(ApiError::invalid(format!(
            "{field}: {:?} is not one of the tools offered",
            &*name
        ))),
        None => Err(ApiError::invalid(format!("{field}: field required {what}"))),
    }
}

/// The offer of `specs` (`None` when there are none and none is asked for). `choice` is
/// `None` when the client named none: a server is then not told one either.
pub(crate) fn tool_offer(
    specs: Vec<ToolSpec>,
    choice: Option<ToolChoice>,
    parallel: Option<bool>,
) -> Result<Option<Box<ToolOffer>>, ApiError> {
    if specs.is_empty() {
        return match choice {
            None | Some(ToolChoice::Auto | ToolChoice::None) => Ok(None),
            Some(_) => Err(ApiError::invalid(
                "tool_choice: asks for a tool call, but no tools are offered",
            )),
        };
    }
    Ok(Some(Box::new(ToolOffer {
        tools: specs,
        choice,
        parallel,
    })))
}

/// Image types every vision model takes (Anthropic's list).
pub(crate) const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// An image URL as servers take it: http(s), or (`data_ok`) a `data:image/…` URL.
pub(crate) fn image_url(url: Str<'_>, data_ok: bool) -> Option<Image> {
    let ok = url.starts_with("https://")
        || url.starts_with("http://")
        || (data_ok && url.starts_with("data:image/"));
    ok.then(|| Image {
        url: url.into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_max_tokens_above_the_limit_is_served_at_the_limit_and_says_so() {
        let models = ["m".to_owned()];
        let limits = Limits::new(&models, 8192);
        assert_eq!(
            max_tokens(8192, "max_tokens", limits).unwrap(),
            (8192, None)
        );
        assert_eq!(max_tokens(1, "max_tokens", limits).unwrap(), (1, None));
        let (served, clamped) = max_tokens(32_000, "max_completion_tokens", limits).unwrap();
        assert_eq!(served, 8192);
        let clamped = clamped.expect("a clamp is reported");
        assert_eq!(clamped.header_value(), "max_completion_tokens=32000->8192");
        // Past u32: still the limit, and the number as asked.
        let (served, clamped) = max_tokens(1 << 40, "max_tokens", limits).unwrap();
        assert_eq!(served, 8192);
        assert_eq!(clamped.unwrap().asked, 1 << 40);
        assert!(max_tokens(0, "max_tokens", limits).is_err());
    }

    #[test]
    fn a_tool_schema_must_be_an_object_or_have_a_default() {
        let raw = |text: &str| RawValue::from_string(text.to_owned()).unwrap();
        let object = raw(r#"{"type":"object"}"#);
        let list = raw("[1]");
        let spec = tool_spec(
            "tools.0",
            Some("f".into()),
            None,
            ("input_schema", Some(&object), None),
        )
        .unwrap();
        assert_eq!(spec.parameters.get(), r#"{"type":"object"}"#);
        let err = tool_spec(
            "tools.0",
            Some("f".into()),
            None,
            ("input_schema", None, None),
        )
        .unwrap_err();
        assert_eq!(
            err.message(),
            "tools.0.input_schema: field required (a JSON schema object)"
        );
        let err = tool_spec(
            "tools.0.function",
            Some("f".into()),
            None,
            ("parameters", Some(&list), Some("{}")),
        )
        .unwrap_err();
        assert_eq!(
            err.message(),
            "tools.0.function.parameters: must be a JSON schema object"
        );
        let spec = tool_spec(
            "tools.0.function",
            Some("f".into()),
            None,
            (
                "parameters",
                None,
                Some(r#"{"type":"object","properties":{}}"#),
            ),
        )
        .unwrap();
        assert_eq!(
            spec.parameters.get(),
            r#"{"type":"object","properties":{}}"#
        );
    }
}
