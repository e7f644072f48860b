//! Finding the retained messages a filter matches by walking the retained index, in
//! subject order, without reading the retained messages of other subjects.
//!
//! The walk follows the pattern token by token. Literal tokens only lengthen the key
//! prefix. A one-token wildcard followed by more literal tokens (`+/temp`,
//! `site/+/door/+/state`) is a *skip scan*: one seek finds the next distinct token at
//! that level, the walk descends into that token's subtree (a key range of its own),
//! then seeks past it. So `+/temp` over 100,000 devices with 50 subjects each reads
//! about one key per device, not 5,000,000. Wildcards with nothing literal after them
//! (`a/#`, `a/+`) read the range under their prefix, which is what they match anyway.
//! Pages resume after the last subject returned. Reads only; never writes.

use canopy_subjects::{Pattern, PatternToken, Subject};

use super::read::{RetainedPage, stored};
use super::{Store, StoreError, keys, record};

/// One page being filled.
struct Walk<'a> {
    store: &'a Store,
    tenant: &'a str,
    pattern: &'a Pattern,
    /// Keys at or below this are already returned (the previous page's last key).
    floor: Option<Vec<u8>>,
    max: usize,
    max_bytes: usize,
    bytes: usize,
    page: RetainedPage,
    /// Keys read (for tests that prove the walk skips).
    reads: u64,
}

/// Whether more keys may be taken.
enum Room {
    More,
    Full,
}

impl Walk<'_> {
    fn key(&self, subject_prefix: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(2 + self.tenant.len() + subject_prefix.len() + 1);
        key.push(keys::RETAINED);
        key.extend_from_slice(self.tenant.as_bytes());
        key.push(0);
        key.extend_from_slice(subject_prefix);
        key
    }

    /// `start`, raised past what earlier pages returned.
    fn above_floor(&self, start: Vec<u8>) -> Vec<u8> {
        match &self.floor {
            Some(floor) if floor.as_slice() >= start.as_slice() => {
                let mut past = floor.clone();
                past.push(0);
                past
            }
            _ => start,
        }
    }

    /// The first retained key in `[start, end)`, with its value.
    async fn first(
        &mut self,
        start: Vec<u8>,
        end: Vec<u8>,
    ) -> Result<Option<super::Found>, StoreError> {
        let start = self.above_floor(start);
        if start >= end {
            return Ok(None);
        }
        self.reads += 1;
        let mut iter = self
            .store
            .db()
            .scan_with_options(start..end, &self.store.db().durable_scan())
            .await?;
        Ok(iter.next().await?)
    }

    /// Takes one retained entry if its subject matches.
    fn take(&mut self, kv: super::Found) -> Room {
        let Some(subject) = keys::marker_subject(self.tenant, &kv.key) else {
            return Room::More;
        };
        if !Subject::parse_native(subject).is_ok_and(|s| self.pattern.matches(&s)) {
            return Room::More;
        }
        if self.page.messages.len() >= self.max.max(1) || self.bytes >= self.max_bytes {
            self.page.next = self.page.messages.last().map(|m| m.subject.clone());
            return Room::Full;
        }
        if let Some((version, mut record)) = record::decode_retained(kv.value) {
            if record.flags & record::SEALED != 0 {
                let keys = self.store.db().sealing().keys_of(self.tenant);
                let context = super::sealed::context(kv.key.get(1..).unwrap_or_default(), version);
                super::sealed::open(keys.as_deref(), &context, &mut record);
            }
            self.bytes += record.headers.len() + record.payload.len();
            self.page.messages.push(stored(subject, version, record));
        }
        Room::More
    }

    /// Every entry whose key lies in `[start, end)`, filtered by the pattern.
    async fn range(&mut self, start: Vec<u8>, end: Vec<u8>) -> Result<Room, StoreError> {
        let start = self.above_floor(start);
        if start >= end {
            return Ok(Room::More);
        }
        let mut iter = self
            .store
            .db()
            .scan_with_options(start..end, &self.store.db().durable_scan())
            .await?;
        while let Some(kv) = iter.next().await? {
            self.reads += 1;
            if let Room::Full = self.take(kv) {
                return Ok(Room::Full);
            }
        }
        Ok(Room::More)
    }

    /// Walks the subjects that start with `prefix` (native, ending with `.` unless
    /// empty) against the pattern tokens `rest`.
    async fn level(&mut self, prefix: Vec<u8>, rest: &[PatternToken]) -> Result<Room, StoreError> {
        match rest.split_first() {
            None => {
                // The subject is the prefix without its trailing dot.
                let subject = prefix.strip_suffix(b".").unwrap_or(&prefix);
                let mut exact = self.key(subject);
                exact.push(0);
                let mut end = exact.clone();
                end.push(0);
                match self.first(exact, end).await? {
                    Some(kv) => Ok(self.take(kv)),
                    None => Ok(Room::More),
                }
            }
            Some((PatternToken::Literal(token), rest)) => {
                let mut deeper = prefix;
                deeper.extend_from_slice(token.as_bytes());
                deeper.push(b'.');
                Box::pin(self.level(deeper, rest)).await
            }
            Some((PatternToken::One, rest))
                if rest.iter().any(|t| matches!(t, PatternToken::Literal(_))) =>
            {
                self.skip_scan(prefix, rest).await
            }
            Some(_) => {
                // Wildcards to the end: the whole range under the prefix (and, for
                // MQTT's `#`, the parent subject itself, which sorts just before it).
                let parent = prefix.strip_suffix(b".").unwrap_or(&prefix);
                let start = self.key(parent);
                let mut end = self.key(&prefix);
                end.push(0xFF);
                self.range(start, end).await
            }
        }
    }

    /// One subtree per distinct token at this level, in key order.
    async fn skip_scan(
        &mut self,
        prefix: Vec<u8>,
        rest: &[PatternToken],
    ) -> Result<Room, StoreError> {
        let base = self.key(&prefix);
        let mut end = base.clone();
        end.push(0xFF);
        let mut from = base.clone();
        while let Some(kv) = self.first(from.clone(), end.clone()).await? {
            let Some(tail) = kv.key.get(base.len()..) else {
                break;
            };
            // The token this key starts with, and whether the key is inside that
            // token's subtree (`token.`) or the subject `token` itself or another.
            let token_len = tail
                .iter()
                .position(|b| *b == b'.' || *b == 0)
                .unwrap_or(tail.len());
            let mut token_key = base.clone();
            token_key.extend_from_slice(tail.get(..token_len).unwrap_or_default());
            let in_subtree = tail.get(token_len) == Some(&b'.');
            if !in_subtree {
                // The subject `prefix token` itself: it has no tokens left for
                // `rest`, which holds a literal. Continue just past it.
                from = token_key;
                from.push(1);
                continue;
            }
            let system = prefix.is_empty() && tail.first() == Some(&b'$');
            if !system {
                let mut deeper = prefix.clone();
                deeper.extend_from_slice(tail.get(..token_len).unwrap_or_default());
                deeper.push(b'.');
                if let Room::Full = Box::pin(self.level(deeper, rest)).await? {
                    return Ok(Room::Full);
                }
            }
            // Past the whole subtree `token.`: `/` is the byte after `.`.
            from = token_key;
            from.push(b'/');
        }
        Ok(Room::More)
    }
}

impl Store {
    /// A page of the retained messages of subjects matching `pattern`, in subject
    /// order, after `after`: see the module documentation for how the index is
    /// walked.
    pub async fn retained(
        &self,
        tenant: &str,
        pattern: &Pattern,
        after: Option<&str>,
        max: usize,
        max_bytes: usize,
    ) -> Result<RetainedPage, StoreError> {
        Ok(self
            .retained_walk(tenant, pattern, after, max, max_bytes)
            .await?
            .0)
    }

    /// [`Store::retained`], also saying how many index keys it read.
    pub(crate) async fn retained_walk(
        &self,
        tenant: &str,
        pattern: &Pattern,
        after: Option<&str>,
        max: usize,
        max_bytes: usize,
    ) -> Result<(RetainedPage, u64), StoreError> {
        let mut walk = Walk {
            store: self,
            tenant,
            pattern,
            floor: None,
            max,
            max_bytes,
            bytes: 0,
            page: RetainedPage::default(),
            reads: 0,
        };
        walk.floor = after.map(|after| {
            let mut key = walk.key(after.as_bytes());
            key.push(0);
            key
        });
        walk.level(Vec::new(), pattern.tokens()).await?;
        Ok((walk.page, walk.reads))
    }
}
