//! The store's side of envelope encryption ([`crate::sealing`]): a message whose
//! subject a tenant's data key covers is written sealed (its header block and
//! payload one ciphertext, the record's [`record::SEALED`] flag set), and opened
//! again where the store reads messages for a reader (`runs::Run::read`, retained
//! messages, snapshots). The associated data is the key's own tenant, subject and
//! version (`m tenant 0 subject 0 version` without its kind byte).
//!
//! Deletions and rewrites (purge, retention, a run cut in two) read records without
//! opening them and write them back as they were. A record whose data key is gone
//! (shredded) reads as [`record::UNREADABLE`], with no payload and a
//! `Canopy-Unreadable` header saying why.
//!
//! Must never: write a covered message's header block or payload in clear, or hand
//! a reader a sealed value as if it were the payload.

use bytes::Bytes;

use super::NewMessage;
use super::record::{self, Record};
use std::sync::Arc;

use crate::sealing::{self, DataKey, Opened, Sealing, TenantKeys};

/// The context of a message or retained message: the key's `tenant 0 subject 0`
/// (without its kind byte and version), then the version.
pub(super) fn context(tenant_and_subject: &[u8], version: u64) -> Vec<u8> {
    let mut context = Vec::with_capacity(tenant_and_subject.len() + 8);
    context.extend_from_slice(tenant_and_subject);
    context.extend_from_slice(&version.to_be_bytes());
    context
}

/// A snapshot's context: apart from its message's, so neither opens as the other.
pub(super) fn snapshot_context(tenant: &str, subject: &str, version: u64) -> Vec<u8> {
    let mut context = b"snapshot\0".to_vec();
    context.extend_from_slice(&sealing::message_context(tenant, subject, version));
    context
}

/// The data key new messages of `subject` are sealed with, if any: asked once per
/// append (its messages share the subject), not per message.
pub(super) fn sealing_key_of(
    sealing: &Sealing,
    tenant: &str,
    subject: &str,
) -> Option<Arc<DataKey>> {
    sealing.keys_of(tenant)?.sealing_key(subject).cloned()
}

/// The form `message` is stored in when `key` seals its subject: its header block
/// and payload sealed, flagged. `None`: stored as it is.
pub(super) fn stored_form(
    key: Option<&DataKey>,
    tenant: &str,
    subject: &str,
    version: u64,
    message: &NewMessage,
) -> Option<NewMessage> {
    let key = key?;
    let context = sealing::message_context(tenant, subject, version);
    let payload = match key.seal(&context, &message.headers, &message.payload) {
        Ok(sealed) => sealed,
        Err(error) => {
            // Only a failing random source gets here. The message is not written in
            // clear: it is kept as a value that reads back unreadable.
            tracing::error!(%error, tenant, subject, version, "a message could not be sealed; it is stored unreadable");
            Bytes::new()
        }
    };
    Some(NewMessage {
        headers: Bytes::new(),
        payload,
        flags: message.flags | record::SEALED,
    })
}

/// `record` opened in place under `context`, when it is sealed.
pub(super) fn open(keys: Option<&TenantKeys>, context: &[u8], record: &mut Record) {
    if record.flags & record::SEALED == 0 {
        return;
    }
    let opened = match keys {
        Some(keys) => keys.open_with(context, &record.payload),
        None => Opened::Unreadable {
            key_id: sealing::key_id_of(&record.payload).unwrap_or(0),
        },
    };
    record.flags &= !record::SEALED;
    match opened {
        Opened::Plain { headers, payload } => {
            record.headers = headers;
            record.payload = payload;
        }
        Opened::Unreadable { key_id } => {
            record.flags |= record::UNREADABLE;
            record.headers = unreadable_headers(key_id);
            record.payload = Bytes::new();
        }
    }
}

/// What a reader gets in place of a message it cannot have.
pub(crate) fn unreadable_headers(key_id: u32) -> Bytes {
    Bytes::from(format!(
        "NATS/1.0\r\nCanopy-Unreadable: data key {key_id} was shredded\r\n\r\n"
    ))
}

/// A stored snapshot's payload when `keys` seal its subject.
pub(super) fn seal_snapshot(
    keys: Option<&TenantKeys>,
    tenant: &str,
    subject: &str,
    version: u64,
    payload: &[u8],
) -> Option<Bytes> {
    let key = keys?.sealing_key(subject)?;
    let sealed = key.seal(&snapshot_context(tenant, subject, version), b"", payload);
    Some(sealed.unwrap_or_else(|error| {
        tracing::error!(%error, tenant, subject, version, "a snapshot could not be sealed; it is stored unreadable");
        Bytes::new()
    }))
}

/// A sealed snapshot's payload, if it opens.
pub(super) fn open_snapshot(
    keys: Option<&TenantKeys>,
    tenant: &str,
    subject: &str,
    version: u64,
    sealed: &[u8],
) -> Option<Bytes> {
    match keys?.open_with(&snapshot_context(tenant, subject, version), sealed) {
        Opened::Plain { payload, .. } => Some(payload),
        Opened::Unreadable { .. } => None,
    }
}

/// The first byte of a sealed saved session (a plain one is JSON, `{`).
const SEALED_SESSION: u8 = 0xFF;

fn session_context(tenant: &str, client_id: &str) -> Vec<u8> {
    let mut context = b"session\0".to_vec();
    context.extend_from_slice(tenant.as_bytes());
    context.push(0);
    context.extend_from_slice(client_id.as_bytes());
    context
}

/// A front end's saved session as stored: sealed with the tenant's newest sealing
/// key while it has one (the session may hold in-flight messages of sealed
/// subjects), else as it is.
pub(super) fn seal_session(
    keys: Option<&TenantKeys>,
    tenant: &str,
    client_id: &str,
    state: &[u8],
) -> Option<Bytes> {
    let key = keys?.newest_sealing_key()?;
    let sealed = key.seal(&session_context(tenant, client_id), b"", state);
    let mut out = vec![SEALED_SESSION];
    match sealed {
        Ok(sealed) => out.extend_from_slice(&sealed),
        Err(error) => {
            tracing::error!(%error, tenant, client_id, "a saved session could not be sealed; it is not kept");
        }
    }
    Some(Bytes::from(out))
}

/// A saved session as its front end wrote it; `None` when it is sealed with a key
/// that is gone (the session then starts afresh).
pub(super) fn open_session(
    keys: Option<&TenantKeys>,
    tenant: &str,
    client_id: &str,
    stored: Bytes,
) -> Option<Bytes> {
    let Some(sealed) = stored.strip_prefix(&[SEALED_SESSION]) else {
        return Some(stored);
    };
    match keys?.open_with(&session_context(tenant, client_id), sealed) {
        Opened::Plain { payload, .. } => Some(payload),
        Opened::Unreadable { key_id } => {
            tracing::warn!(
                tenant,
                client_id,
                key_id,
                "a saved session's data key is gone; it starts afresh"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_keys_context_is_the_sealing_modules() {
        let key = super::super::keys::message("t", "a.b", 9);
        let tenant_and_subject = &key[1..key.len() - 8];
        assert_eq!(
            context(tenant_and_subject, 9),
            sealing::message_context("t", "a.b", 9)
        );
        let retained = super::super::keys::retained("t", "a.b");
        assert_eq!(
            context(&retained[1..], 9),
            sealing::message_context("t", "a.b", 9)
        );
    }
}
