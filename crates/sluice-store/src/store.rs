//! [`Store`]: one opened database, every role. The roles are implemented in their own
//! modules, each for any [`Dialect`].

use std::sync::Arc;

use crate::dialect::{Dialect, Pool};
use crate::filter_sets::SetCache;
use crate::prices::TradeIdMemory;
use crate::redis_sets::RedisSets;

/// The metadata of a process, in one database: a pool, the in-memory copies of filter-value
/// sets, and the counted trade ids. Opened by [`crate::open`] (or
/// [`SqliteStore::open`](crate::SqliteStore::open) / [`PgStore::open`](crate::PgStore::open));
/// clones share everything.
pub struct Store<D: Dialect> {
    pub(crate) pool: Pool<D>,
    pub(crate) sets: Arc<SetCache>,
    pub(crate) trade_ids: Arc<tokio::sync::Mutex<TradeIdMemory>>,
    /// Where set-filter values live when not in the database (`--sets redis://…`).
    pub(crate) redis: Option<Arc<RedisSets>>,
}

impl<D: Dialect> Store<D> {
    /// A store on `pool`, not migrated yet.
    pub(crate) fn on_pool(pool: Pool<D>) -> Self {
        Self { pool, sets: SetCache::shared(), trade_ids: Arc::default(), redis: None }
    }

    /// This store with set-filter values in `sets` (Redis) instead of its own tables; the
    /// tables keep each set's id, and the pipeline row still orders the set's writers.
    #[must_use]
    pub fn with_redis_sets(mut self, sets: Arc<RedisSets>) -> Self {
        self.redis = Some(sets);
        self
    }
}

impl<D: Dialect> Clone for Store<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            sets: self.sets.clone(),
            trade_ids: self.trade_ids.clone(),
            redis: self.redis.clone(),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for Store<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("backend", &D::BACKEND).finish_non_exhaustive()
    }
}

/// The current time as stored (RFC 3339 text).
pub(crate) fn now() -> String {
    sluice_core::time::format(chrono::Utc::now())
}
