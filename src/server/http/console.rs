//! The console's files and the browser client module, embedded in the binary so they
//! work with no internet access and no files beside the server.
//!
//! Must never: read files from disk at run time.

use axum::http::header;
use axum::response::IntoResponse;

/// A file of the console: its content type and its text, embedded in the binary so
/// the console works with no internet access and no files beside the server.
pub(super) type ConsoleFile = (&'static str, &'static str);

pub(super) const CONSOLE_PAGE: ConsoleFile = (
    "text/html; charset=utf-8",
    include_str!("../../../web/console/index.html"),
);
pub(super) const CONSOLE_SCRIPT: ConsoleFile = (
    "text/javascript; charset=utf-8",
    include_str!("../../../web/console/console.js"),
);
pub(super) const CONSOLE_STYLE: ConsoleFile = (
    "text/css; charset=utf-8",
    include_str!("../../../web/console/console.css"),
);

pub(super) async fn console_file((content_type, body): ConsoleFile) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, content_type)], body)
}

/// The browser client, an ES module embedded in the binary.
pub(super) async fn client_module() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../../../web/canopy.js"),
    )
}
