//! A push consumer's plan: the stored messages its deliver policy picks from before
//! it was made, in offset order. Must never hold more than [`MAX_PLANNED`] entries or
//! keep more than [`KEEP_BYTES`] of messages whole, nor more than its tenant has left
//! of [`TENANT_PLANNED`] and [`TENANT_KEEP_BYTES`] (all its consumers' plans).

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

/// The messages stored before `end` that `spec`'s deliver policy picks, in offset
/// order.
/// What a plan takes of its tenant's budget: entries, and bytes kept whole.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PlanCost {
    pub entries: usize,
    pub kept_bytes: usize,
}

pub(super) async fn plan(
    store: &Store,
    tenant: &str,
    spec: &PushSpec,
    patterns: &[Pattern],
    end: u64,
    left: PlanCost,
) -> Result<(VecDeque<Planned>, PlanCost), PushError> {
    let mut collect = Collect {
        planned: Vec::new(),
        kept_bytes: 0,
        keep_bytes: KEEP_BYTES.min(left.kept_bytes),
        max_planned: MAX_PLANNED.min(left.entries),
    };
    match spec.start {
        PushStart::New => {}
        PushStart::All => {
            read_range(
                store,
                tenant,
                patterns,
                ReplayFrom::Start,
                end,
                &mut collect,
            )
            .await?
        }
        PushStart::Offset(offset) => {
            let from = ReplayFrom::Offset(offset);
            read_range(store, tenant, patterns, from, end, &mut collect).await?;
        }
        PushStart::Time(ms) => {
            let from = ReplayFrom::Time(ms);
            read_range(store, tenant, patterns, from, end, &mut collect).await?;
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
    Ok((collect.planned.into(), cost))
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
