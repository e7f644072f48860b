//! Fuzzes the `/ws` request decoder (what the server reads from untrusted browsers): no panic;
//! a decoded op encodes back to itself and keeps within the limits; an error is typed. The
//! checks are the corpus test's `tests/common/ws.rs`, included here by path.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../tests/common/ws.rs"]
mod ws;

fuzz_target!(|data: &[u8]| {
    // A WebSocket text message is UTF-8; other bytes are read as replacement characters
    // rather than thrown away.
    let _ = ws::check(&String::from_utf8_lossy(data));
});
