//! One subject's messages of one round, built into the one run key they are written
//! as (`store/runs.rs` reads them back).
//!
//! Must never: take a version that does not follow the run's last, or grow a run
//! past its bounds.

use crate::store::keys;
use crate::store::record;
use crate::store::runs::{RUN_MAX_BYTES, RUN_MAX_MESSAGES};
use crate::store::writes::Writes;

/// The messages of one subject in one round, written as one key.
pub(super) struct OpenRun {
    first: u64,
    pub(super) builder: record::RunBuilder,
}

impl OpenRun {
    pub(super) fn new(first: u64, payload: usize) -> OpenRun {
        OpenRun {
            first,
            builder: record::RunBuilder::new(payload),
        }
    }

    /// Whether `version` can go on this run: the next one, and the run not full.
    pub(super) fn takes(&self, version: u64) -> bool {
        version == self.first + u64::from(self.builder.count())
            && self.builder.count() < RUN_MAX_MESSAGES
            && self.builder.bytes() < RUN_MAX_BYTES
    }

    pub(super) fn write(self, batch: &mut Writes, tenant: &str, subject: &str) {
        if self.builder.count() > 0 {
            batch.put_run(
                keys::message(tenant, subject, self.first),
                self.builder.finish(),
            );
        }
    }
}
