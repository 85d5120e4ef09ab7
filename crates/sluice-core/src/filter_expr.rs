//! The set-filter expression: the one Bloblang form Sluice supports, `root = this.<path>`.
//!
//! A path is dotted field names (`[A-Za-z_][A-Za-z0-9_]*`) and numeric array indexes:
//! `root = this.address`, `root = this.payload.coin`, `root = this.topics.0`. Anything else
//! is rejected when a pipeline is stored, so it can never fail at run time.

use std::fmt;

/// The form every error message names.
pub const SUPPORTED_FORM: &str = "root = this.<field>[.<field or array index>...]";

/// One step of a path into a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSegment {
    Field(String),
    Index(usize),
}

/// A parsed `filter_expr`: the path of the value the filter tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterExpr {
    path: Vec<PathSegment>,
}

/// Why a `filter_expr` was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterExprError {
    #[error("filter_expr must have the form `{SUPPORTED_FORM}`")]
    NotAssignment,
    #[error(
        "filter_expr path segment {position} ({segment:?}) is neither a field name nor an array index; supported form: `{SUPPORTED_FORM}`"
    )]
    BadSegment { position: usize, segment: String },
}

impl FilterExpr {
    /// Parses `root = this.<path>`; whitespace around `=` and at the ends is allowed.
    ///
    /// # Errors
    /// [`FilterExprError`] naming the supported form.
    pub fn parse(text: &str) -> Result<Self, FilterExprError> {
        let rest = text.trim().strip_prefix("root").ok_or(FilterExprError::NotAssignment)?;
        let rest = rest.trim_start().strip_prefix('=').ok_or(FilterExprError::NotAssignment)?;
        let rest = rest.trim_start().strip_prefix("this.").ok_or(FilterExprError::NotAssignment)?;
        let path = rest
            .split('.')
            .enumerate()
            .map(|(position, segment)| {
                parse_segment(segment).ok_or_else(|| FilterExprError::BadSegment {
                    position: position + 1,
                    segment: segment.to_owned(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &[PathSegment] {
        &self.path
    }
}

fn parse_segment(segment: &str) -> Option<PathSegment> {
    let mut chars = segment.chars();
    let first = chars.next()?;
    if first.is_ascii_digit() {
        return segment
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| segment.parse().ok().map(PathSegment::Index))
            .flatten();
    }
    let is_ident = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    is_ident.then(|| PathSegment::Field(segment.to_owned()))
}

impl fmt::Display for FilterExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("root = this")?;
        for segment in &self.path {
            match segment {
                PathSegment::Field(name) => write!(f, ".{name}")?,
                PathSegment::Index(index) => write!(f, ".{index}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str) -> PathSegment {
        PathSegment::Field(name.to_owned())
    }

    #[test]
    fn parses_dotted_fields_and_indexes() {
        let expr = FilterExpr::parse("  root=this.payload.topics.0  ").unwrap();
        assert_eq!(expr.path(), &[field("payload"), field("topics"), PathSegment::Index(0)]);
        assert_eq!(expr.to_string(), "root = this.payload.topics.0");
        assert_eq!(FilterExpr::parse("root = this._a1").unwrap().path(), &[field("_a1")]);
    }

    #[test]
    fn rejects_everything_else_naming_the_supported_form() {
        for text in [
            "",
            "root = this",
            "root = this.",
            "root = this.a..b",
            "root = this.a[0]",
            "root = this.a.1x",
            "root = this.address.lowercase()",
            "root = \"x\"",
            "this.address",
            "root == this.address",
            "root = this.a-b",
            "root = this.99999999999999999999999",
        ] {
            let error = FilterExpr::parse(text).unwrap_err();
            assert!(error.to_string().contains(SUPPORTED_FORM), "{text}: {error}");
        }
    }
}
