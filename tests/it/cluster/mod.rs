//! Several nodes on one object store, coordinated through a real etcd (started by
//! scripts/test-all.sh): membership, shard ownership, handover and lease loss.

mod coordination;
mod data;
mod definitions;
mod mqtt;
mod processes;
mod seeing;
mod tables;
mod ws;

/// The etcd the tests share; each test uses a cluster name of its own.
pub fn etcd_endpoint() -> String {
    std::env::var("CANOPY_TEST_ETCD").unwrap_or_else(|_| {
        panic!(
            "CANOPY_TEST_ETCD is not set: run ./scripts/test-all.sh, which starts an etcd \
             for the cluster tests"
        )
    })
}

/// A cluster name no other test uses.
pub fn fresh_cluster_name() -> String {
    format!("t{:016x}", fastrand::u64(..))
}
