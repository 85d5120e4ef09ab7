//! The one timestamp format of the API and the store: RFC 3339, UTC, microseconds, `Z`.
//!
//! A fixed width keeps stored timestamps sortable as text on both SQLite and PostgreSQL.

use chrono::{DateTime, SecondsFormat, Utc};

/// Formats `at` as `2026-11-21T14:39:55.123456Z`.
pub fn format(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses any RFC 3339 timestamp into UTC.
///
/// # Errors
/// When `text` is not RFC 3339.
pub fn parse(text: &str) -> Result<DateTime<Utc>, chrono::ParseError> {
    DateTime::parse_from_rfc3339(text).map(|at| at.with_timezone(&Utc))
}

/// `#[serde(with = "sluice_core::time::rfc3339")]` for `DateTime<Utc>` fields.
pub mod rfc3339 {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*at))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        super::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn formats_with_fixed_width_microseconds_and_z() {
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(format(at), "2026-01-02T03:04:05.000000Z");
        assert_eq!(parse("2026-01-02T04:04:05+01:00").unwrap(), at);
    }
}

/// `#[serde(with = "sluice_core::time::rfc3339_option")]` for `Option<DateTime<Utc>>` fields.
pub mod rfc3339_option {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(at: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match at {
            Some(at) => s.serialize_str(&super::format(*at)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| super::parse(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}
