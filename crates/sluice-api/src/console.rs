//! The web console: a plain ES module application served at `/`, its files embedded in the
//! binary at compile time (no build step; `crates/sluice-api/console/`). It uses only the
//! public API; see docs/console.md.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The console's files: `(name, content type, bytes)`. `vendor/` holds uPlot 1.6.32 (MIT,
/// `npm pack uplot@1.6.32`, its `dist/uPlot.iife.min.js` and `dist/uPlot.min.css` as they
/// come), the charting library of the metrics page.
const FILES: [(&str, &str, &str); 6] = [
    ("app.js", "text/javascript; charset=utf-8", include_str!("../console/app.js")),
    ("events.js", "text/javascript; charset=utf-8", include_str!("../console/events.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../console/style.css")),
    ("index.html", "text/html; charset=utf-8", include_str!("../console/index.html")),
    (
        "vendor/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/vendor/uPlot.iife.min.js"),
    ),
    (
        "vendor/uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../console/vendor/uPlot.min.css"),
    ),
];

/// Scripts and styles only from this origin, no inline code, no framing: a value an API
/// response carries can never run as script in the console.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'self'";

/// `GET /` and `GET /console/{file}`.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { file("index.html") }))
        .route("/console/{file}", get(|Path(name): Path<String>| async move { file(&name) }))
        .route(
            "/console/vendor/{file}",
            get(|Path(name): Path<String>| async move { file(&format!("vendor/{name}")) }),
        )
}

fn file(name: &str) -> Response {
    let Some((_, content_type, body)) = FILES.iter().find(|(file, _, _)| *file == name) else {
        return (StatusCode::NOT_FOUND, axum::Json(serde_json::json!({"detail": "Not Found"})))
            .into_response();
    };
    let mut response = (*body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The files change with the binary: always revalidate.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers
        .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_served_with_its_type_and_the_policy_and_others_are_404() {
        for (name, content_type, body) in FILES {
            let response = file(name);
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()[header::CONTENT_TYPE], content_type);
            assert!(
                response.headers()[header::CONTENT_SECURITY_POLICY]
                    .to_str()
                    .unwrap()
                    .contains("script-src 'self'")
            );
            assert!(!body.is_empty());
        }
        assert_eq!(file("../Cargo.toml").status(), StatusCode::NOT_FOUND);
        assert_eq!(file("secrets.key").status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_page_loads_its_module_and_styles_from_this_origin_only() {
        let index = FILES.iter().find(|(n, _, _)| *n == "index.html").unwrap().2;
        assert!(index.contains(r#"<script type="module" src="/console/app.js"></script>"#));
        assert!(index.contains(r#"href="/console/style.css""#));
        assert!(!index.contains("http://") && !index.contains("https://"), "no CDN");
        assert!(index.contains(r#"src="/console/vendor/uPlot.iife.min.js""#));
        for module in ["app.js", "events.js"] {
            let code = FILES.iter().find(|(n, _, _)| *n == module).unwrap().2;
            assert!(!code.contains("innerHTML"), "values reach the page as text only");
            assert!(!code.contains("localStorage"), "the key stays in sessionStorage");
        }
    }
}
