//! The status page's files at `/ui`: an HTML page, its script and style, and the chart
//! library (uPlot, vendored from npm under `ui/vendor/`, MIT), all embedded in the binary.
//! They hold no data: the page asks for the admin token once and reads everything through
//! the admin API (`/admin/events`, `/admin/status`) with it, and its buttons call the admin
//! API's own endpoints. Served only where the admin API is on.

use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use ringmaster_api::ApiError;
use ringmaster_gateway::ResponseBody;

/// One embedded file: path under `/ui/`, content type, bytes.
type Asset = (&'static str, &'static str, &'static [u8]);

const ASSETS: [Asset; 5] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../ui/app.css"),
    ),
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/vendor/uPlot.iife.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("../ui/vendor/uPlot.min.css"),
    ),
];

/// The page's policy: its own files only, no inline script, talking to this origin only.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /ui`, `/ui/`, `/ui/FILE`.
pub(crate) fn serve(path: &str) -> Result<Response<ResponseBody>, ApiError> {
    let name = match path.trim_start_matches("/ui").trim_start_matches('/') {
        "" => "index.html",
        name => name,
    };
    let Some((_, content_type, bytes)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return Err(ApiError::not_found(format!(
            "no such file in the status page: {name}"
        )));
    };
    let mut response = Response::new(ringmaster_gateway::full_body(*bytes));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // A new binary brings new files: the browser asks again rather than keep a stale page.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_served_and_nothing_else() {
        for path in [
            "/ui",
            "/ui/",
            "/ui/index.html",
            "/ui/app.js",
            "/ui/uPlot.min.css",
        ] {
            let response = serve(path).unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert!(response.headers().contains_key("content-security-policy"));
        }
        for path in [
            "/ui/../Cargo.toml",
            "/ui/nope.js",
            "/ui/vendor/LICENSE-uPlot",
        ] {
            assert!(serve(path).is_err(), "{path}");
        }
    }
}
