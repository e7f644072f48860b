//! `canopy cluster status`: a cluster as etcd holds it (its nodes with their
//! addresses, shares and leases, and each shard's owner and offset), read straight from etcd,
//! so it answers even when no node does.

use std::time::Duration;

use anyhow::{Context, Result};
use canopy::cluster::{Etcd, Status};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Show the cluster's nodes, their shares of the shards and their leases, and
    /// each shard's owner and durable offset (as the owner last reported it, every
    /// two seconds while it moves).
    Status {
        /// etcd's client URLs, comma-separated.
        #[arg(
            long,
            env = "CANOPY_ETCD",
            value_delimiter = ',',
            default_value = "http://127.0.0.1:2379"
        )]
        etcd: Vec<String>,
        /// The cluster's name (`cluster.name` of its nodes).
        #[arg(long, default_value = "canopy")]
        name: String,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(command: ClusterCommand) -> Result<()> {
    match command {
        ClusterCommand::Status { etcd, name, json } => {
            let client = Etcd::new(&etcd, Duration::from_secs(5))?;
            let status = canopy::cluster::status(&client, &name, canopy::clock::system_ms())
                .await
                .with_context(|| format!("reading cluster {name} from etcd"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", render(&status));
            }
            Ok(())
        }
    }
}

fn render(status: &Status) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if status.shards == 0 {
        let _ = writeln!(out, "cluster {}: no node has ever joined", status.cluster);
        return out;
    }
    let owned = status.owners.iter().filter(|s| s.owner.is_some()).count();
    let _ = writeln!(
        out,
        "cluster {}: {} node(s), {owned}/{} shards owned",
        status.cluster,
        status.nodes.len(),
        status.shards
    );
    for node in &status.nodes {
        let lease = node
            .lease_left_secs
            .map_or("gone".to_owned(), |s| format!("{s}s left"));
        let _ = writeln!(
            out,
            "node {}  native {}{}{}  shards {}  lease {lease}",
            node.record.id,
            node.record.native,
            node.record
                .mqtt
                .as_deref()
                .map_or(String::new(), |a| format!("  mqtt {a}")),
            node.record
                .http
                .as_deref()
                .map_or(String::new(), |a| format!("  http {a}")),
            node.shards,
        );
    }
    for shard in &status.owners {
        match (&shard.owner, shard.owned_for_ms) {
            (Some(owner), Some(ms)) => {
                let offset = shard
                    .offset
                    .map_or(String::new(), |o| format!("  offset {o}"));
                let _ = writeln!(
                    out,
                    "shard {:04}  {owner}  for {:.1}s{offset}",
                    shard.shard,
                    ms as f64 / 1000.0
                );
            }
            _ => {
                let _ = writeln!(out, "shard {:04}  (free)", shard.shard);
            }
        }
    }
    out
}
