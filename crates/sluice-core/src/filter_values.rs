//! Set-filter values outside the store: how they are normalised, and how a stored change
//! reaches whatever keeps an in-memory copy (the runtime's set indexes).
//!
//! The store is the source of truth. Every handler that changes filter values first commits
//! the change to the store, then tells the [`FilterValuesListener`]; the listener must cope
//! with hearing a change it already saw in a snapshot (every change is idempotent when
//! replayed in order).

/// The form in which values are stored and matched: lowercased (Unicode lowercase, which for ASCII is plain ASCII lowercase) (addresses, labels and
/// symbols are compared case-insensitively).
pub fn normalize(value: &str) -> String {
    value.to_lowercase()
}

/// A change to one set filter's values, already committed to the store. Values are
/// normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterValuesChange<'a> {
    /// These values were added (some may have been present already).
    Added(&'a [String]),
    /// These values were removed (some may have been absent).
    Removed(&'a [String]),
    /// The set now holds exactly these values.
    Replaced(&'a [String]),
    /// The transform (or its pipeline) is gone, and its values with it.
    Dropped,
}

/// Hears committed filter-value changes.
pub trait FilterValuesListener: Send + Sync + 'static {
    fn changed(&self, pipeline_id: &str, transform_uid: &str, change: FilterValuesChange<'_>);

    /// Whether changes reach this listener from a change feed rather than through
    /// [`FilterValuesListener::changed`]; the writer then waits for
    /// [`FilterValuesListener::caught_up`] before it answers.
    fn follows_feed(&self) -> bool {
        false
    }

    /// Whether this listener's copy of one set holds the set's stored `(id, version)`
    /// `stored`, read after a write (`None`: the set is gone or empty). A listener without
    /// a copy of the set holds it.
    fn caught_up(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        stored: Option<(i64, i64)>,
    ) -> bool {
        let _ = (pipeline_id, transform_uid, stored);
        true
    }
}

/// A listener for a process that keeps no in-memory copies (tools, and API tests that run
/// no pipelines): the store alone holds the values.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoInMemoryCopies;

impl FilterValuesListener for NoInMemoryCopies {
    fn changed(&self, _: &str, _: &str, _: FilterValuesChange<'_>) {}
}
