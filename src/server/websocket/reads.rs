//! The read requests of `/ws`: get, replay, subjects and snapshots. Each is parsed
//! here under the connection's limits and read through the API's `History`, which
//! judges it as a subscription by the user's rules and filters it by the configured
//! deny list, as for the native API. Never routes or stores a message (snapshot.put
//! is the store's own write).

use super::*;
use crate::api::ApiError;
use crate::api::history::{History, Of};

impl Connection {
    /// The tenant's stored history, as this connection's user may read it.
    fn history<'a>(&'a self, store: &'a Arc<crate::store::Store>) -> History<'a> {
        History {
            broker: &self.broker,
            store,
            principal: self.session.principal(),
            tenant: &self.session.routes().name,
        }
    }

    pub(super) async fn get(
        &mut self,
        id: Option<&str>,
        subject: &str,
        version: Option<u64>,
    ) -> Result<(), Refusal> {
        let subject = self.subject(subject)?;
        let store = self.store()?;
        let message = self
            .history(&store)
            .get(subject.as_str(), version)
            .await
            .map_err(refused)?;
        self.push(|out| ws::encode_message(out, id, &stored_message(&message)));
        Ok(())
    }

    /// The latest snapshot of `subject`, or the latest at or below `version`.
    pub(super) async fn snapshot(
        &mut self,
        id: Option<&str>,
        subject: &str,
        version: Option<u64>,
    ) -> Result<(), Refusal> {
        let subject = self.subject(subject)?;
        let store = self.store()?;
        let snapshot = self
            .history(&store)
            .snapshot(subject.as_str(), version)
            .await
            .map_err(refused)?;
        self.push(|out| ws::encode_snapshot(out, id, &snapshot_body(&snapshot)));
        Ok(())
    }

    /// Stores the client's snapshot of `subject` at `version`.
    pub(super) async fn put_snapshot(
        &mut self,
        id: Option<&str>,
        put: ws::SnapshotPut<'_>,
    ) -> Result<(), Refusal> {
        let subject = self.subject(&put.subject)?;
        let json = put.data.is_json();
        let payload = put.data.into_bytes();
        let store = self.store()?;
        self.history(&store)
            .put_snapshot(subject.as_str(), put.version, &payload, json)
            .await
            .map_err(refused)?;
        self.push(|out| ws::encode_snapshot_stored(out, id, subject.as_str(), put.version));
        Ok(())
    }

    /// One page of history: of a subject (from a version) or of a pattern (from a
    /// tenant offset), or from a time.
    pub(super) async fn replay(
        &mut self,
        id: Option<&str>,
        replay: &ws::Replay<'_>,
    ) -> Result<(), Refusal> {
        let store = self.store()?;
        let max = replay.page_size();
        let from = replay.from.map_or(ReplayFrom::Start, replay_from);
        let history = self.history(&store);
        let page = match &replay.target {
            Target::Subject(subject) => {
                let subject = self.subject(subject)?;
                history
                    .replay(Of::Subject(subject.as_str()), from, max, REPLAY_BYTES)
                    .await
            }
            Target::Pattern(pattern) => {
                let pattern = self.pattern(pattern)?;
                history
                    .replay(Of::Pattern(&pattern), from, max, REPLAY_BYTES)
                    .await
            }
        }
        .map_err(refused)?;
        let messages: Vec<ws::StoredMessage<'_>> =
            page.messages.iter().map(stored_message).collect();
        self.push(|out| ws::encode_page(out, id, &messages, page.next, page.caught_up));
        Ok(())
    }

    /// One page of stored subjects matching `pattern`, with their heads.
    pub(super) async fn subjects(
        &mut self,
        id: Option<&str>,
        request: &ws::Subjects<'_>,
    ) -> Result<(), Refusal> {
        let store = self.store()?;
        let pattern = self.pattern(&request.pattern)?;
        let page = self
            .history(&store)
            .subjects(&pattern, request.after.as_deref(), request.page_size())
            .await
            .map_err(refused)?;
        let heads: Vec<ws::SubjectHead<'_>> = page
            .subjects
            .iter()
            .map(|h| ws::SubjectHead {
                subject: &h.subject,
                version: h.version,
                offset: h.offset,
                time_ms: h.time_ms,
            })
            .collect();
        self.push(|out| ws::encode_subjects(out, id, &heads, page.next.as_deref()));
        Ok(())
    }

    pub(super) fn store(&self) -> Result<Arc<crate::store::Store>, Refusal> {
        self.broker
            .store_of(&self.session.routes().name)
            .ok_or_else(|| {
                refusal(
                    ErrorCode::Unavailable,
                    "the tenant's store is not open on this node",
                )
            })
    }
}

/// The API's refusal of a read, as a `/ws` error.
fn refused(error: ApiError) -> Refusal {
    let code = match error.code {
        400 => ErrorCode::BadRequest,
        403 => ErrorCode::Forbidden,
        404 => ErrorCode::NotFound,
        409 => ErrorCode::Conflict,
        _ => ErrorCode::Unavailable,
    };
    refusal(code, error.description)
}
