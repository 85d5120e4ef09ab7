//! [`Forwarding`]: a [`StreamLog`] that passes every call on to another one, asking
//! [`Hooks`] on the way. For tests that inject faults (a reader that crashes, a sink write
//! that fails) or count what a component does to the log, without repeating the whole trait.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::{
    AppendWatch, NewRecord, OffsetRange, Position, Record, Result, StreamLog, TopicConfig,
};

/// What a [`Forwarding`] log asks before (or after) passing a call on. Every method has a
/// default that changes nothing.
pub trait Hooks: Send + Sync + 'static {
    /// Before a read of `partition` of `topic` from `from` (it may panic, as a crashing
    /// reader would).
    fn before_read(&self, _topic: &str, _partition: u32, _from: u64) {}

    /// After a read, with the records it returned.
    fn after_read(&self, _topic: &str, _partition: u32, _records: &[Record]) {}

    /// Before an append-and-commit: an error is answered instead of making it.
    fn before_append_and_commit(&self) -> Result<()> {
        Ok(())
    }
}

/// A log that forwards every call to `inner`, consulting `hooks` on reads and on
/// append-and-commit.
pub struct Forwarding<H> {
    inner: Arc<dyn StreamLog>,
    hooks: H,
}

impl<H: Hooks> Forwarding<H> {
    pub fn new(inner: Arc<dyn StreamLog>, hooks: H) -> Self {
        Self { inner, hooks }
    }

    /// The hooks, to arm or read them.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }
}

impl<H> std::fmt::Debug for Forwarding<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarding").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<H: Hooks> StreamLog for Forwarding<H> {
    async fn create_topic(&self, topic: &str, config: TopicConfig) -> Result<TopicConfig> {
        self.inner.create_topic(topic, config).await
    }

    async fn delete_topic(&self, topic: &str) -> Result<bool> {
        self.inner.delete_topic(topic).await
    }

    async fn topic(&self, topic: &str) -> Result<Option<TopicConfig>> {
        self.inner.topic(topic).await
    }

    async fn append(&self, topic: &str, records: Vec<NewRecord>) -> Result<Vec<Position>> {
        self.inner.append(topic, records).await
    }

    async fn append_and_commit(
        &self,
        appends: &[(&str, &[NewRecord])],
        group: &str,
        source: &str,
        offsets: &[(u32, u64)],
    ) -> Result<()> {
        self.hooks.before_append_and_commit()?;
        self.inner.append_and_commit(appends, group, source, offsets).await
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<Record>> {
        self.hooks.before_read(topic, partition, from);
        let records = self.inner.read(topic, partition, from, max).await?;
        self.hooks.after_read(topic, partition, &records);
        Ok(records)
    }

    async fn offsets(&self, topic: &str) -> Result<Vec<OffsetRange>> {
        self.inner.offsets(topic).await
    }

    async fn offset_for_time(&self, topic: &str, partition: u32, timestamp_ms: i64) -> Result<u64> {
        self.inner.offset_for_time(topic, partition, timestamp_ms).await
    }

    async fn commit(&self, group: &str, topic: &str, offsets: &[(u32, u64)]) -> Result<()> {
        self.inner.commit(group, topic, offsets).await
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<BTreeMap<u32, u64>> {
        self.inner.committed(group, topic).await
    }

    async fn delete_group(&self, group: &str) -> Result<()> {
        self.inner.delete_group(group).await
    }

    async fn enforce_retention(&self) -> Result<u64> {
        self.inner.enforce_retention().await
    }

    fn watch(&self, topic: &str) -> AppendWatch {
        self.inner.watch(topic)
    }
}
