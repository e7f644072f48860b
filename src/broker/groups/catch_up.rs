//! A group catching up with the store: loading its cursors, walking the subjects its
//! pattern matches a page at a time, and taking in what the sequencer routed once it
//! is durable. Every store read here takes the tenant's and then the server's
//! catch-up place in turn. Must never hand a message out (that is `delivery.rs`).

use super::*;

impl GroupTask {
    /// One step of the walk over the group's subjects.
    pub(super) async fn walk_one_page(&mut self) {
        let Scan::Walking(after) = &self.scan else {
            return;
        };
        let after = after.clone();
        // A walk that begins after a lag must see what was dropped: the sequencer
        // routes a round before writing it, so wait until what was routed is stored.
        if after.is_none()
            && let Err(error) = self.store.durable_barrier().await
        {
            self.scan = Scan::Wanted;
            tracing::warn!(group = %self.spec.name, %error, "a group could not start its walk");
            return;
        }
        match self.scan_page(after.as_deref()).await {
            Ok(Some(next)) => self.scan = Scan::Walking(Some(next)),
            Ok(None) => self.scan = Scan::Done,
            Err(error) => {
                // Tried again at the next demand, not in a loop against a failing
                // store.
                self.scan = Scan::Wanted;
                tracing::warn!(group = %self.spec.name, %error, "a group could not read its subjects");
            }
        }
    }

    /// Hands the dispatcher the messages routed since the last call, once they are
    /// durable: the sequencer routes a round before its write, and a group hands out
    /// (and later acks past) only what a restart would still find.
    pub(super) async fn take_observed(&mut self) {
        if self.observed.is_empty() {
            return;
        }
        if self.store.durable_barrier().await.is_err() {
            return;
        }
        let now = self.clock.now_ms();
        // A dropped message sets the flag before anything offered after it, so a
        // group that sees it clear has every message since its walk.
        let complete = self.scan == Scan::Done && !self.lagging.load(Ordering::Acquire);
        for (subject, version, message) in std::mem::take(&mut self.observed) {
            if self.before_start(now) {
                self.dispatcher.pass_over(&subject, version, now);
                continue;
            }
            // Untracked after a whole walk with nothing dropped since: this is the
            // subject's first version since the start, and nothing older is owed.
            if self.dispatcher.cursor(&subject).is_none()
                && self.spec.start != StartAt::All
                && !complete
            {
                match self.first_version(&subject, version).await {
                    Ok(first) => self
                        .dispatcher
                        .restore(Arc::clone(&subject), first - 1, version),
                    Err(error) => {
                        tracing::warn!(group = %self.spec.name, %error, "a group could not read a subject");
                        continue;
                    }
                }
            }
            self.dispatcher.observe(&subject, version, now);
            let Observed {
                offset,
                time_ms,
                headers,
                payload,
            } = message;
            let copy = KeptMessage::copied(offset, time_ms, &headers, &payload);
            self.kept.keep(&subject, version, copy);
        }
    }

    /// Reads the group's cursors, one range read; their subjects' heads come with the
    /// walk over the subjects, or with their next message.
    pub(super) async fn load(&mut self) -> Result<(), StoreError> {
        let _pace = self.pace.step().await;
        for (subject, acked) in self.store.cursors(&self.tenant, &self.spec.name).await? {
            self.dispatcher.restore(Arc::from(subject), acked, acked);
        }
        Ok(())
    }

    /// Tells the dispatcher the heads of one page of the subjects the pattern
    /// matches, after `after`; returns where the next page starts, if any.
    pub(super) async fn scan_page(
        &mut self,
        after: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let _pace = self.pace.step().await;
        self.count_catch_up_read();
        let (heads, next) = self
            .store
            .subject_heads(&self.tenant, &self.pattern, after, SCAN_PAGE)
            .await?;
        let since = self.since();
        for head in heads {
            let subject: Arc<str> = Arc::from(head.subject.as_str());
            if self.dispatcher.cursor(&subject).is_none() {
                // Nothing of it is the group's: not tracked at all, and not read. Its
                // next message finds the first version owed then.
                if since.is_some_and(|since| head.time_ms < since) {
                    continue;
                }
                let first = match self.spec.start {
                    StartAt::All => 1,
                    _ => self.first_version(&subject, head.version).await?,
                };
                self.dispatcher
                    .restore(Arc::clone(&subject), first - 1, head.version);
            } else if self.before_start(self.clock.now_ms()) {
                self.dispatcher
                    .pass_over(&subject, head.version, self.clock.now_ms());
            } else {
                self.dispatcher
                    .observe(&subject, head.version, self.clock.now_ms());
            }
            // The listing read the head whole: kept when owed, so a subject whose
            // newest message is the one owed is delivered without another read.
            if self
                .dispatcher
                .cursor(&subject)
                .is_some_and(|acked| head.version > acked)
            {
                self.kept.keep_read(&subject, &head);
            }
        }
        Ok(next)
    }

    pub(super) fn count_catch_up_read(&self) {
        if let Some(broker) = self.broker.upgrade() {
            broker.metrics().count_group_catch_up_read();
        }
    }

    /// When the group's messages begin, unless it takes every stored one.
    pub(super) fn since(&self) -> Option<u64> {
        match self.spec.start {
            StartAt::All => None,
            StartAt::Time(ms) => Some(ms),
            StartAt::New => Some(self.created_ms),
        }
    }

    /// Whether the group's start time is still ahead at `now`: what is stored now is
    /// before it.
    pub(super) fn before_start(&self, now: u64) -> bool {
        matches!(self.spec.start, StartAt::Time(at) if now < at)
    }

    /// The first version of `subject` (whose newest is `head`) the group's start
    /// takes in: `head + 1` when every stored one is older.
    pub(super) async fn first_version(&self, subject: &str, head: u64) -> Result<u64, StoreError> {
        let since = match self.spec.start {
            StartAt::All => return Ok(1),
            StartAt::Time(ms) => ms,
            StartAt::New => self.created_ms,
        };
        self.count_catch_up_read();
        let page = self
            .store
            .replay_subject(&self.tenant, subject, ReplayFrom::Time(since), 1, 1 << 20)
            .await?;
        Ok(page
            .messages
            .first()
            .map_or(head + 1, |first| first.version))
    }
}
