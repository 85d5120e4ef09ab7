//! `sluice-filter` owns the set-filter stage: a record (the raw bytes of a JSON object)
//! passes when the value at one path, lowercased, is in a set of possibly tens of millions
//! of values.
//!
//! It is pure computation: it must not depend on any I/O or async crate, nor on any Sluice
//! crate other than `sluice-core` (whose [`FilterExpr`](sluice_core::filter_expr::FilterExpr)
//! it evaluates and whose [`normalize`](sluice_core::filter_values::normalize) defines the
//! lowercasing). Keeping sets up to date and feeding records through is the runtime's job.
//!
//! Start reading at [`SetFilter`] (the semantics, and [`SetFilter::passes_batch`] for
//! throughput), then [`value_set`] (the memory layout) and [`extract()`] (the raw JSON walk).
//! `docs/set-filter.md` has the semantics and measured figures.

pub mod candidates;
pub mod extract;
pub mod set_filter;
pub mod value_set;

pub use candidates::Candidates;
pub use extract::{Extracted, extract};
pub use set_filter::SetFilter;
pub use value_set::{Prepared, ValueSet};
