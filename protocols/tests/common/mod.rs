//! Test machinery shared by the integration tests: feeding bytes to a decoder in chunks and
//! collecting what comes out ([`stream`], which the fuzz targets share too), checking one `/ws`
//! request ([`ws`], shared with the `ws_client` fuzz target), and replaying a
//! fuzz corpus with deterministic mutations ([`corpus`]).
//!
//! Must never: hide a decoder error or a buffer that grew past its bound.

#![allow(dead_code)]

pub mod corpus;
pub mod stream;
pub mod ws;
