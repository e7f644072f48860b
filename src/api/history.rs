//! Stored history as every front end reads it: one message, a snapshot, a page of a
//! subject's or pattern's history, a page of subjects. A front end parses its own
//! request (JSON on the native API, `/ws` ops) and checks the syntax under its own
//! limits; the right to read is checked here, once, as a subscription by the
//! caller's rules, and what is answered is filtered by the configured deny list. The
//! native API (`read.rs`, `snapshots.rs`) and `/ws` (`server/websocket/reads.rs`)
//! both come through here.
//!
//! Must never: answer anything the caller could not subscribe to, store a snapshot it
//! could not publish, or hold more than one page.

use std::sync::Arc;

use canopy_subjects::Pattern;

use crate::broker::Broker;
use crate::follow::{Follower, Page, Target};
use crate::store::{ReplayFrom, Snapshot, Store, StoreError, StoredMessage, SubjectsPage};
use crate::tenancy::{Action, Principal};

use super::{ApiError, authorize};

/// A caller reading its tenant's stored history.
pub(crate) struct History<'a> {
    pub broker: &'a Broker,
    pub store: &'a Arc<Store>,
    pub principal: &'a Principal,
    pub tenant: &'a Arc<str>,
}

/// What a page of history is of.
pub(crate) enum Of<'a> {
    Subject(&'a str),
    Pattern(&'a Pattern),
}

impl History<'_> {
    fn may_read(&self, pattern: &str) -> Result<(), ApiError> {
        authorize(self.broker, self.principal, Action::Subscribe, pattern)?;
        super::plugins::unfiltered(&self.broker.tenant(self.tenant), pattern)
    }

    /// One message of `subject`: `version`, or the newest.
    pub(crate) async fn get(
        &self,
        subject: &str,
        version: Option<u64>,
    ) -> Result<StoredMessage, ApiError> {
        self.may_read(subject)?;
        self.store
            .get(self.tenant, subject, version)
            .await?
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    match version {
                        Some(v) => format!("{subject} has no version {v}"),
                        None => format!("{subject} has no messages"),
                    },
                )
            })
    }

    /// The newest snapshot of `subject`, or the newest at or below `version`.
    pub(crate) async fn snapshot(
        &self,
        subject: &str,
        version: Option<u64>,
    ) -> Result<Snapshot, ApiError> {
        self.may_read(subject)?;
        self.store
            .snapshot(self.tenant, subject, version)
            .await?
            .ok_or_else(|| ApiError::new(404, format!("{subject} has no snapshot")))
    }

    /// Stores the caller's snapshot of `subject` at `version`: writing one is
    /// publishing to the subject. One past the subject's head is a conflict.
    pub(crate) async fn put_snapshot(
        &self,
        subject: &str,
        version: u64,
        payload: &[u8],
        json: bool,
    ) -> Result<(), ApiError> {
        authorize(self.broker, self.principal, Action::Publish, subject)?;
        self.store
            .put_snapshot(self.tenant, subject, version, payload, json)
            .await
            .map_err(|error| match error {
                StoreError::Refused(reason) => ApiError::new(409, reason),
                other => other.into(),
            })
    }

    /// A follower of `of`'s history from `from`, in pages of `max` messages and about
    /// `max_bytes`, once the caller may read it.
    pub(crate) fn follower(
        &self,
        of: Of<'_>,
        from: ReplayFrom,
        max: usize,
        max_bytes: usize,
    ) -> Result<Follower, ApiError> {
        let target = match of {
            Of::Subject(subject) => {
                self.may_read(subject)?;
                Target::Subject(subject.to_owned())
            }
            Of::Pattern(pattern) => {
                self.may_read(&pattern.to_string())?;
                Target::Pattern(pattern.clone())
            }
        };
        Ok(Follower::new(
            Arc::clone(self.store),
            Arc::clone(self.tenant),
            target,
            from,
        )
        .pages_of(max, max_bytes))
    }

    /// One page of history from `from`, without what the deny list keeps out.
    pub(crate) async fn replay(
        &self,
        of: Of<'_>,
        from: ReplayFrom,
        max: usize,
        max_bytes: usize,
    ) -> Result<Page, ApiError> {
        let mut page = self.follower(of, from, max, max_bytes)?.next().await?;
        self.keep_deliverable(&mut page.messages);
        Ok(page)
    }

    /// Drops what the configured deny list keeps out: a broad pattern was allowed,
    /// the denied subjects still never show.
    pub(crate) fn keep_deliverable(&self, messages: &mut Vec<StoredMessage>) {
        let authz = self.broker.authorizer();
        if authz.filters_delivery() {
            messages.retain(|m| authz.may_deliver(&m.subject));
        }
    }

    /// One page of the subjects `pattern` matches, with their heads, after `after`.
    pub(crate) async fn subjects(
        &self,
        pattern: &Pattern,
        after: Option<&str>,
        max: usize,
    ) -> Result<SubjectsPage, ApiError> {
        self.may_read(&pattern.to_string())?;
        let mut page = self
            .store
            .subjects(self.tenant, pattern, after, max)
            .await?;
        let authz = self.broker.authorizer();
        page.subjects
            .retain(|head| authz.may_deliver(&head.subject));
        Ok(page)
    }
}
