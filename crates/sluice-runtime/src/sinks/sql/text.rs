//! The text the SQL backends write a row as — PostgreSQL's `COPY` text and MySQL's string
//! literals — built a run of bytes at a time: a batch is thousands of rows, and these are
//! the sink's own work per cell.

use chrono::{DateTime, Datelike, Timelike, Utc};

use super::Cell;

/// Appends `cells`, each written by `cell` and separated by `separator`: one row of a
/// backend's text.
pub fn row(out: &mut String, cells: &[Cell<'_>], separator: char, cell: fn(&mut String, &Cell)) {
    for (index, value) in cells.iter().enumerate() {
        if index > 0 {
            out.push(separator);
        }
        cell(out, value);
    }
}

/// Appends `text` to `out`, each byte that `escape` names replaced by its escape. Only ASCII
/// bytes may be escaped, so the runs between them stay whole UTF-8.
pub fn escaped(out: &mut String, text: &str, escape: impl Fn(u8) -> Option<&'static str>) {
    let mut start = 0;
    for (at, byte) in text.bytes().enumerate() {
        if let Some(replacement) = escape(byte) {
            out.push_str(&text[start..at]);
            out.push_str(replacement);
            start = at + 1;
        }
    }
    out.push_str(&text[start..]);
}

/// Appends `n` in decimal, as `Display` writes it, without the formatting machinery (two
/// integers a row, on every row of a transfer).
pub fn integer(out: &mut String, n: i64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `at` as `YYYY-MM-DD HH:MM:SS.ffffff` (UTC, microseconds), what both databases
/// read for a timestamp; years outside 0–9999 go through chrono's formatter.
pub fn time(out: &mut String, at: &DateTime<Utc>) {
    let year = at.year();
    if !(0..=9999).contains(&year) {
        out.push_str(&at.format("%Y-%m-%d %H:%M:%S%.6f").to_string());
        return;
    }
    // A leap second is second 59 with a nanosecond past 1e9; chrono shows it as second 60.
    let (leap, nanos) = (at.nanosecond() / 1_000_000_000, at.nanosecond() % 1_000_000_000);
    let mut digits = [0u8; 26];
    let mut put = |from: usize, width: usize, mut value: u32| {
        for slot in digits[from..from + width].iter_mut().rev() {
            *slot = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year.unsigned_abs());
    put(5, 2, at.month());
    put(8, 2, at.day());
    put(11, 2, at.hour());
    put(14, 2, at.minute());
    put(17, 2, at.second() + leap);
    put(20, 6, nanos / 1000);
    for (index, separator) in [(4, b'-'), (7, b'-'), (10, b' '), (13, b':'), (16, b':'), (19, b'.')]
    {
        digits[index] = separator;
    }
    out.push_str(std::str::from_utf8(&digits).expect("ASCII digits"));
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn escaping_replaces_only_the_named_bytes_and_keeps_utf8_runs() {
        let mut out = String::new();
        let tabs = |b: u8| (b == b'\t').then_some("\\t");
        escaped(&mut out, "a\tbé\t€\t", tabs);
        assert_eq!(out, "a\\tbé\\t€\\t");
        out.clear();
        escaped(&mut out, "", tabs);
        escaped(&mut out, "plain", tabs);
        assert_eq!(out, "plain");
    }

    #[test]
    fn integers_are_written_as_display_writes_them() {
        for n in [0, 7, -7, 10, 1_000_003, -30_000_000, i64::MAX, i64::MIN] {
            let mut out = String::from("|");
            integer(&mut out, n);
            assert_eq!(out, format!("|{n}"));
        }
        let mut out = String::new();
        integer(&mut out, i64::MIN);
        assert_eq!(out, "-9223372036854775808");
    }

    #[test]
    fn times_read_as_chrono_writes_them() {
        let cases = [
            Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap(),
            Utc.timestamp_opt(1_700_000_000, 123_456_789).unwrap(),
            Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc.timestamp_opt(1_483_228_799, 1_500_000_000).unwrap(),
            Utc.with_ymd_and_hms(12_000, 1, 1, 0, 0, 0).unwrap(),
        ];
        for at in cases {
            let mut out = String::new();
            time(&mut out, &at);
            assert_eq!(out, at.format("%Y-%m-%d %H:%M:%S%.6f").to_string(), "{at:?}");
        }
    }
}
