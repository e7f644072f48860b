//! A push consumer's plan: the stored messages its deliver policy picks from before
//! it was made, in offset order. A plan from a point of the log on (`all`, a
//! sequence, a time) that would pass its bounds is not listed at all: the consumer's
//! follower reads that history itself ([`Plan::Streamed`]), and only the newest of
//! each subject (`last_per_subject`) past them is refused. Must never hold more than
//! [`MAX_PLANNED`] entries or keep more than [`KEEP_BYTES`] of messages whole, nor
//! more than its tenant has left of [`TENANT_PLANNED`] and [`TENANT_KEEP_BYTES`] (all
//! its consumers' plans).

use std::collections::VecDeque;

use canopy_subjects::{Pattern, Subject};

use super::{PushError, PushSpec, PushStart};
use crate::store::{ReplayFrom, Store, StoredMessage};

/// Most messages a plan holds: a larger one is refused.
pub const MAX_PLANNED: usize = 1_000_000;
/// Bytes of planned messages kept whole; past them a planned message keeps only where
/// it is and is read again when its turn comes.
pub const KEEP_BYTES: usize = 16 * 1024 * 1024;
/// What all of one tenant's plans hold at most: entries, and bytes kept whole.
pub const TENANT_PLANNED: usize = 4_000_000;
pub const TENANT_KEEP_BYTES: usize = 64 * 1024 * 1024;
/// Messages and bytes one read of the plan takes from the store.
const PAGE: usize = 1_000;
const PAGE_BYTES: usize = 1024 * 1024;

/// One planned message: whole, or where to read it.
#[derive(Debug)]
pub(super) enum Planned {
    Kept(StoredMessage),
    At {
        subject: String,
        version: u64,
        offset: u64,
    },
}

impl Planned {
    pub(super) fn offset(&self) -> u64 {
        match self {
            Planned::Kept(message) => message.offset,
            Planned::At { offset, .. } => *offset,
        }
    }
}

/// Collects planned messages, keeping the first [`KEEP_BYTES`] whole.
struct Collect {
    planned: Vec<Planned>,
    kept_bytes: usize,
    /// Bytes it may keep whole: [`KEEP_BYTES`], or what its tenant has left.
    keep_bytes: usize,
    /// Entries it may hold: [`MAX_PLANNED`], or what its tenant has left.
    max_planned: usize,
}

impl Collect {
    fn push(&mut self, message: StoredMessage) -> Result<(), PushError> {
        if self.planned.len() >= self.max_planned {
            return Err(PushError::PlanTooLarge);
        }
        let size = message.payload.len() + message.headers.len() + message.subject.len();
        if self.kept_bytes + size <= self.keep_bytes {
            self.kept_bytes += size;
            self.planned.push(Planned::Kept(message));
        } else {
            self.planned.push(Planned::At {
                subject: message.subject,
                version: message.version,
                offset: message.offset,
            });
        }
        Ok(())
    }
}

/// What a plan takes of its tenant's budget: entries, and bytes kept whole.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PlanCost {
    pub entries: usize,
    pub kept_bytes: usize,
}

/// What a consumer delivers before it follows the log live.
pub(super) enum Plan {
    /// These messages (what it takes of its tenant's budget with them).
    Listed(VecDeque<Planned>, PlanCost),
    /// Everything its filters match from this point of the log on, read by its
    /// follower as it goes (too many to list).
    Streamed(ReplayFrom),
}

/// The messages stored before `end` that `spec`'s deliver policy picks, in offset
/// order.
pub(super) async fn plan(
    store: &Store,
    tenant: &str,
    spec: &PushSpec,
    patterns: &[Pattern],
    end: u64,
    left: PlanCost,
) -> Result<Plan, PushError> {
    let mut collect = Collect {
        planned: Vec::new(),
        kept_bytes: 0,
        keep_bytes: KEEP_BYTES.min(left.kept_bytes),
        max_planned: MAX_PLANNED.min(left.entries),
    };
    let from = match spec.start {
        PushStart::All => Some(ReplayFrom::Start),
        PushStart::Offset(offset) => Some(ReplayFrom::Offset(offset)),
        PushStart::Time(ms) => Some(ReplayFrom::Time(ms)),
        _ => None,
    };
    match spec.start {
        PushStart::New => {}
        PushStart::All | PushStart::Offset(_) | PushStart::Time(_) => {
            let from = from.unwrap_or(ReplayFrom::Start);
            match read_range(store, tenant, patterns, from, end, &mut collect).await {
                Err(PushError::PlanTooLarge) => return Ok(Plan::Streamed(from)),
                other => other?,
            }
        }
        PushStart::LastPerSubject | PushStart::Last => {
            read_heads(store, tenant, patterns, end, &mut collect).await?;
            collect.planned.sort_by_key(Planned::offset);
            if spec.start == PushStart::Last {
                let last = collect.planned.pop();
                collect.planned = last.into_iter().collect();
            }
        }
    }
    let cost = PlanCost {
        entries: collect.planned.len(),
        kept_bytes: collect.kept_bytes,
    };
    Ok(Plan::Listed(collect.planned.into(), cost))
}

/// Every message the patterns match from `from` up to `end`: a literal pattern
/// (one key's history) reads only its subject.
async fn read_range(
    store: &Store,
    tenant: &str,
    patterns: &[Pattern],
    from: ReplayFrom,
    end: u64,
    collect: &mut Collect,
) -> Result<(), PushError> {
    if let [one] = patterns
        && one.is_literal()
    {
        let subject = one.to_string();
        // Only the first page may start by offset or time; the later ones go on by
        // version, so the floor is kept here.
        let (min_offset, min_time) = match from {
            ReplayFrom::Offset(offset) => (offset, 0),
            ReplayFrom::Time(ms) => (0, ms),
            _ => (0, 0),
        };
        let mut at = from;
        loop {
            let page = store
                .replay_subject(tenant, &subject, at, PAGE, PAGE_BYTES)
                .await?;
            for message in page.messages {
                if message.offset >= end {
                    return Ok(());
                }
                if message.offset >= min_offset && message.time_ms >= min_time {
                    collect.push(message)?;
                }
            }
            if page.caught_up {
                return Ok(());
            }
            at = ReplayFrom::Version(page.next);
        }
    }
    let matches = |subject: &str| {
        Subject::parse_native(subject).is_ok_and(|s| patterns.iter().any(|p| p.matches(&s)))
    };
    let mut at = from;
    loop {
        let page = store
            .replay_matching(tenant, &matches, at, PAGE, PAGE_BYTES)
            .await?;
        for message in page.messages {
            if message.offset >= end {
                return Ok(());
            }
            collect.push(message)?;
        }
        if page.caught_up || page.next >= end {
            return Ok(());
        }
        at = ReplayFrom::Offset(page.next);
    }
}

/// The newest message of each subject the patterns match, of those stored before
/// `end` (a subject written again since is left to the live part).
async fn read_heads(
    store: &Store,
    tenant: &str,
    patterns: &[Pattern],
    end: u64,
    collect: &mut Collect,
) -> Result<(), PushError> {
    for pattern in patterns {
        let mut each = |head: StoredMessage| {
            if head.offset < end {
                collect.push(head)?;
            }
            Ok::<(), PushError>(())
        };
        store
            .each_head(tenant, pattern, (PAGE, usize::MAX), &mut each)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use object_store::memory::InMemory;

    use super::*;
    use crate::store::tests::{request, settings};
    use crate::store::{AckTo, AppendOutcome, Sequenced, StoreEvents};

    struct Quiet;

    impl StoreEvents for Quiet {
        fn sequenced(&self, _: &[Sequenced<'_>]) {}
        fn acknowledged(&self, _: Vec<(Arc<str>, AckTo, AppendOutcome)>) {}
    }

    fn spec(start: PushStart) -> PushSpec {
        PushSpec {
            stream: Arc::from("t"),
            name: Arc::from("c"),
            filters: vec!["a.>".into()],
            deliver_subject: None,
            start,
            headers_only: false,
            heartbeat: None,
            inactive: Duration::from_secs(5),
            config: serde_json::Value::Null,
            created_ms: 0,
            inbox_of: None,
        }
    }

    fn room(entries: usize) -> PlanCost {
        PlanCost {
            entries,
            kept_bytes: KEEP_BYTES,
        }
    }

    /// A plan from a point of the log that would pass its bounds is left to the
    /// follower (from that point); the newest of each subject past them is refused.
    #[tokio::test]
    async fn a_plan_too_large_to_list_is_streamed_from_its_start() {
        let store = Store::open(settings(Arc::new(InMemory::new())), Arc::new(Quiet))
            .await
            .expect("opens");
        for i in 0..12 {
            let mut r = request(&format!("a.{}", i % 4), "x", 0);
            r.ack = None;
            store.append(r).await.expect("queued");
        }
        store.durable_barrier().await.expect("barrier");
        let end = store.next_offset("t").await.expect("end");
        let patterns = [Pattern::parse_native("a.>").expect("a pattern")];
        let plan_of = |start, entries| {
            let spec = spec(start);
            let store = &store;
            let patterns = &patterns;
            async move { plan(store, "t", &spec, patterns, end, room(entries)).await }
        };

        match plan_of(PushStart::All, 100).await.expect("planned") {
            Plan::Listed(listed, cost) => assert_eq!((listed.len(), cost.entries), (12, 12)),
            Plan::Streamed(_) => panic!("12 messages fit in 100"),
        }
        for (start, from) in [
            (PushStart::All, ReplayFrom::Start),
            (PushStart::Offset(3), ReplayFrom::Offset(3)),
            (PushStart::Time(0), ReplayFrom::Time(0)),
        ] {
            match plan_of(start, 5).await.expect("planned") {
                Plan::Streamed(streamed) => assert_eq!(streamed, from, "{start:?}"),
                Plan::Listed(listed, _) => {
                    panic!("{start:?}: {} listed in room for 5", listed.len())
                }
            }
        }
        match plan_of(PushStart::LastPerSubject, 4)
            .await
            .expect("planned")
        {
            Plan::Listed(listed, _) => assert_eq!(listed.len(), 4, "one per subject"),
            Plan::Streamed(_) => panic!("heads are never streamed"),
        }
        assert!(matches!(
            plan_of(PushStart::LastPerSubject, 3).await,
            Err(PushError::PlanTooLarge)
        ));
    }
}
