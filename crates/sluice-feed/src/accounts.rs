//! Pools of recurring accounts, so that the same wallets and contracts show up again and
//! again as on a real chain (and set filters on an address have something to match).

use rand::Rng;
use rand::rngs::StdRng;

pub(crate) struct Accounts {
    pool: Vec<String>,
    fresh: fn(&mut StdRng) -> String,
    fresh_share: f64,
}

impl Accounts {
    /// `size` recurring accounts made by `fresh`; a `fresh_share` of picks is a new account.
    pub(crate) fn new(
        rng: &mut StdRng,
        size: usize,
        fresh: fn(&mut StdRng) -> String,
        fresh_share: f64,
    ) -> Self {
        let pool = (0..size).map(|_| fresh(rng)).collect();
        Self { pool, fresh, fresh_share }
    }

    /// One account; recurring accounts are skewed towards the start of the pool, so a few
    /// are very active and most are occasional.
    pub(crate) fn pick(&self, rng: &mut StdRng) -> String {
        if self.pool.is_empty() || rng.gen_bool(self.fresh_share) {
            return (self.fresh)(rng);
        }
        let r: f64 = rng.r#gen();
        let index = ((r * r) * self.pool.len() as f64) as usize;
        self.pool[index.min(self.pool.len() - 1)].clone()
    }

    /// `n` distinct accounts from the pool (fewer if the pool is smaller).
    pub(crate) fn distinct(&self, rng: &mut StdRng, n: usize) -> Vec<String> {
        rand::seq::index::sample(rng, self.pool.len(), n.min(self.pool.len()))
            .into_iter()
            .map(|index| self.pool[index].clone())
            .collect()
    }
}
