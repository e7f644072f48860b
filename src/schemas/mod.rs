//! JSON Schemas bound to subject patterns (issue 16). So far only the rule every new
//! version of a binding's schema is held to: [`compat`]. Must never parse a message
//! payload it has no schema for.

pub mod compat;
