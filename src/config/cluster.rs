//! `[cluster]`: several nodes on one object store, coordinated through etcd. Absent,
//! the server is one node on its own store, as always.
//!
//! Must never: reach etcd or check the store's URL (that is `Config::validate`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// The etcd members' client URLs (`http://host:2379`).
    pub etcd: Vec<String>,
    /// The cluster's name: its keys in etcd live under `/<name>/`, so one etcd can
    /// serve several clusters.
    pub name: String,
    /// This node's id: unique among the cluster's live nodes, the same after a
    /// restart. Letters, digits, `-` and `_`.
    pub node_id: String,
    /// Where this node listens for the other nodes (port 0: any free port).
    pub listen: std::net::SocketAddr,
    /// The host clients and other nodes reach this node at (default: the native
    /// listener's address).
    pub advertise_host: Option<String>,
    /// Shards the store is split into. Fixed when the cluster is first made: a node
    /// configured with another number refuses to join.
    pub shards: u32,
    /// Seconds a node's lease outlives its last renewal: how long its shards wait
    /// before another node takes them when it dies.
    pub lease_secs: u64,
    /// A secret every node of the cluster shares (16 bytes or more): each
    /// connection between nodes proves it, since a link says who is calling. Unset:
    /// nodes trust whoever connects to their cluster port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            etcd: vec!["http://127.0.0.1:2379".into()],
            name: "canopy".into(),
            node_id: String::new(),
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 7422)),
            advertise_host: None,
            shards: 16,
            lease_secs: 5,
            secret: None,
        }
    }
}

/// Most shards a cluster may have.
pub const MAX_SHARDS: u32 = 1024;

impl ClusterConfig {
    /// The section's own rules; the store's URL is checked against it by the caller.
    pub fn check(&self) -> Result<(), String> {
        let token = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !token(&self.node_id) {
            return Err(format!(
                "cluster.node_id `{}` must be 1 to 64 letters, digits, `-` or `_`",
                self.node_id
            ));
        }
        if !token(&self.name) {
            return Err(format!(
                "cluster.name `{}` must be 1 to 64 letters, digits, `-` or `_`",
                self.name
            ));
        }
        if self.etcd.is_empty() {
            return Err("cluster.etcd must name at least one endpoint".into());
        }
        if self.secret.as_ref().is_some_and(|s| s.len() < 16) {
            return Err("cluster.secret must be 16 bytes or more".into());
        }
        if let Some(bad) = self
            .etcd
            .iter()
            .find(|e| !e.starts_with("http://") && !e.starts_with("https://"))
        {
            return Err(format!(
                "cluster.etcd: `{bad}` is not an http:// or https:// URL"
            ));
        }
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(format!("cluster.shards must be 1 to {MAX_SHARDS}"));
        }
        if !(2..=120).contains(&self.lease_secs) {
            return Err("cluster.lease_secs must be 2 to 120".into());
        }
        Ok(())
    }
}
