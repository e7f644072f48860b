//! Deleting history: one subject, or every subject matching a pattern.
//!
//! A purge deletes what is durable up to the subject's head when it starts, in
//! chunks of separate engine writes, so publishes (to the same subject too) go on
//! meanwhile: a purge never goes through the sequencer and never holds it. The
//! subject marker keeps the purged version and offset, so a restart never gives a
//! version again. Snapshots of the subject go too; msg ids expire on their own.

use bytes::Bytes;
use canopy_subjects::Pattern;
use slatedb::WriteBatch;

use super::{Store, StoreError, keys, put_durably, record, runs, write_durably};

/// Deletes per engine write.
const DELETE_CHUNK: usize = 1000;

/// What a purge removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub subjects: u64,
    pub messages: u64,
}

impl Store {
    /// Deletes every message and snapshot of `subject` up to its current head.
    pub async fn purge_subject(&self, tenant: &str, subject: &str) -> Result<Purged, StoreError> {
        self.purge_subject_through(tenant, subject, u64::MAX).await
    }

    /// Deletes the messages and snapshots of `subject` up to version `through` (a
    /// rollup keeps the version after it; `u64::MAX`: up to its current head).
    pub async fn purge_subject_through(
        &self,
        tenant: &str,
        subject: &str,
        through: u64,
    ) -> Result<Purged, StoreError> {
        let _deleting = self.deleting.lock().await;
        // What the rounds not yet in the engine hold must be there before it is
        // deleted, or their flush would write it again.
        self.db().flush_unflushed().await?;
        // What the engine holds, which is all there was when the purge began.
        let found = if through == u64::MAX {
            runs::newest(self.db(), tenant, subject, runs::Seen::Flushed).await?
        } else {
            runs::at(self.db(), tenant, subject, through, runs::Seen::Flushed)
                .await?
                .map(|found| (through, found))
        };
        let Some((version, newest)) = found else {
            return Ok(Purged::default());
        };
        // The marker first: should we stop half way, versions still never repeat.
        put_durably(
            self.db(),
            keys::subject_marker(tenant, subject),
            record::encode_marker(version, newest.offset),
        )
        .await?;
        let (mut messages, mut bytes) = (0, 0);
        loop {
            let mut batch = WriteBatch::new();
            let deleted = runs::delete_through(
                self.db(),
                tenant,
                subject,
                version,
                DELETE_CHUNK,
                &mut batch,
            )
            .await?;
            write_durably(self.db(), batch).await?;
            messages += deleted.messages;
            bytes += deleted.bytes;
            if deleted.done {
                break;
            }
            tokio::task::yield_now().await;
        }
        self.release(tenant, bytes).await;
        self.delete_range(keys::snapshots_up_to(tenant, subject, version))
            .await?;
        // The retained message goes with the history it came from; one retained by a
        // publish after the purge began stays.
        let retained = keys::retained(tenant, subject);
        let flushed = self
            .db()
            .get_flushed(&retained, &self.db().durable_read())
            .await?;
        if let Some(value) = flushed
            && record::decode_retained(value)
                .is_none_or(|(retained_version, _)| retained_version <= version)
        {
            let mut batch = slatedb::WriteBatch::new();
            batch.delete(&retained);
            super::write_durably(self.db(), batch).await?;
        }
        Ok(Purged {
            subjects: 1,
            messages,
        })
    }

    /// Purges every stored subject matching `pattern`, a page of subjects at a time.
    pub async fn purge_pattern(
        &self,
        tenant: &str,
        pattern: &Pattern,
    ) -> Result<Purged, StoreError> {
        let mut total = Purged::default();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .subjects(tenant, pattern, after.as_deref(), 100)
                .await?;
            for head in &page.subjects {
                let purged = self.purge_subject(tenant, &head.subject).await?;
                total.subjects += purged.subjects;
                total.messages += purged.messages;
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(total),
            }
        }
    }

    /// Deletes a range of keys (snapshots, a group's cursors), in chunks.
    pub(super) async fn delete_range(
        &self,
        range: std::ops::Range<Bytes>,
    ) -> Result<(), StoreError> {
        loop {
            // A fresh scan per chunk: an iterator is not kept across our own writes.
            let mut chunk = self.db().scan(range.clone()).await?;
            let mut batch = WriteBatch::new();
            let mut n = 0;
            while n < DELETE_CHUNK {
                let Some(kv) = chunk.next().await? else {
                    break;
                };
                batch.delete(&kv.key);
                n += 1;
            }
            if n == 0 {
                return Ok(());
            }
            write_durably(self.db(), batch).await?;
            tokio::task::yield_now().await;
        }
    }
}
