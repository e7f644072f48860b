//! The read requests of `/ws`: get, replay, subjects and snapshots, each judged
//! as a subscription by the user's rules and filtered by the configured deny list.
//! Never routes or stores a message (snapshot.put is the store's own write).

use super::*;

impl Connection {
    pub(super) async fn get(
        &mut self,
        id: Option<&str>,
        subject: &str,
        version: Option<u64>,
    ) -> Result<(), Refusal> {
        let subject = self.subject(subject)?;
        self.may_read(subject.as_str())?;
        let store = self.store()?;
        let found = store
            .get(&self.session.routes().name, subject.as_str(), version)
            .await
            .map_err(|e| refusal(ErrorCode::Unavailable, e.to_string()))?;
        let Some(message) = found else {
            return Err(refusal(
                ErrorCode::NotFound,
                format!("{subject} has no such message"),
            ));
        };
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
        self.may_read(subject.as_str())?;
        let store = self.store()?;
        let Some(snapshot) = store
            .snapshot(&self.session.routes().name, subject.as_str(), version)
            .await
            .map_err(|e| refusal(ErrorCode::Unavailable, e.to_string()))?
        else {
            return Err(refusal(
                ErrorCode::NotFound,
                format!("{subject} has no snapshot"),
            ));
        };
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
        self.broker
            .authorizer()
            .authorize(self.session.principal(), Action::Publish, subject.as_str())
            .map_err(|denied| refusal(ErrorCode::Forbidden, denied.to_string()))?;
        let json = put.data.is_json();
        let payload = put.data.into_bytes();
        let store = self.store()?;
        store
            .put_snapshot(
                &self.session.routes().name,
                subject.as_str(),
                put.version,
                &payload,
                json,
            )
            .await
            .map_err(|e| match e {
                crate::store::StoreError::Refused(reason) => refusal(ErrorCode::Conflict, reason),
                other => refusal(ErrorCode::Unavailable, other.to_string()),
            })?;
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
        let tenant = Arc::clone(&self.session.routes().name);
        let page = match &replay.target {
            Target::Subject(subject) => {
                let subject = self.subject(subject)?;
                self.may_read(subject.as_str())?;
                store
                    .replay_subject(&tenant, subject.as_str(), from, max, REPLAY_BYTES)
                    .await
            }
            Target::Pattern(pattern) => {
                let pattern = self.pattern(pattern)?;
                self.may_read(&pattern.to_string())?;
                store
                    .replay_pattern(&tenant, &pattern, from, max, REPLAY_BYTES)
                    .await
            }
        }
        .map_err(|e| refusal(ErrorCode::Unavailable, e.to_string()))?;
        let authz = self.broker.authorizer();
        let messages: Vec<ws::StoredMessage<'_>> = page
            .messages
            .iter()
            .filter(|m| authz.may_deliver(&m.subject))
            .map(stored_message)
            .collect();
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
        self.may_read(&pattern.to_string())?;
        let page = store
            .subjects(
                &self.session.routes().name,
                &pattern,
                request.after.as_deref(),
                request.page_size(),
            )
            .await
            .map_err(|e| refusal(ErrorCode::Unavailable, e.to_string()))?;
        let authz = self.broker.authorizer();
        let heads: Vec<ws::SubjectHead<'_>> = page
            .subjects
            .iter()
            .filter(|h| authz.may_deliver(&h.subject))
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
            .store()
            .cloned()
            .ok_or_else(|| refusal(ErrorCode::Unavailable, "the store is not open"))
    }

    /// Reading stored history is subscribing to it, for the deny lists.
    pub(super) fn may_read(&self, pattern: &str) -> Result<(), Refusal> {
        self.broker
            .authorizer()
            .authorize(self.session.principal(), Action::Subscribe, pattern)
            .map_err(|denied| refusal(ErrorCode::Forbidden, denied.to_string()))
    }
}
