//! The shards a cluster node owns, each its own store under the store's place, opened
//! when the node wins the shard and closed when it hands it over or loses it.
//!
//! Must never: keep serving a shard after [`ShardHost::close`], or open one twice.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::broker::Broker;
use crate::broker::durable::StoreRouter;
use crate::cluster::{Closing, ShardHost};
use crate::store::{Store, StoreSettings};

/// The node's open shard stores.
pub struct ShardStores {
    broker: Arc<Broker>,
    /// The settings every shard's store is opened with, but for its place.
    settings: StoreSettings,
    open: tokio::sync::Mutex<BTreeMap<u32, Arc<Store>>>,
}

impl ShardStores {
    pub fn new(broker: Arc<Broker>, settings: StoreSettings) -> Self {
        Self {
            broker,
            settings,
            open: tokio::sync::Mutex::default(),
        }
    }

    /// The shards open now.
    pub async fn open_shards(&self) -> Vec<u32> {
        self.open.lock().await.keys().copied().collect()
    }
}

#[async_trait::async_trait]
impl ShardHost for ShardStores {
    async fn open(&self, shard: u32) -> Result<(), String> {
        let mut open = self.open.lock().await;
        if open.contains_key(&shard) {
            return Ok(());
        }
        let mut settings = self.settings.clone();
        settings.url = settings
            .url
            .shard(shard)
            .ok_or_else(|| "a store in memory cannot be shared by nodes".to_owned())?;
        settings.clock = self.broker.clock().clone();
        // Opening bumps the database's writer epoch: a stalled previous owner that
        // wakes now is fenced at its next write.
        let store = Store::open(settings, Arc::new(StoreRouter::new(&self.broker)))
            .await
            .map_err(|e| e.to_string())?;
        open.insert(shard, Arc::new(store));
        Ok(())
    }

    async fn close(&self, shard: u32, how: Closing) {
        let Some(store) = self.open.lock().await.remove(&shard) else {
            return;
        };
        match (how, store.close().await) {
            (_, Ok(())) => {}
            (Closing::Handover, Err(error)) => {
                tracing::error!(shard, %error, "the shard's store did not close cleanly")
            }
            // A lost shard's store may well be fenced already: nothing it still
            // held was acknowledged.
            (Closing::Lost, Err(error)) => {
                tracing::warn!(shard, %error, "closed a lost shard's store")
            }
        }
    }
}
