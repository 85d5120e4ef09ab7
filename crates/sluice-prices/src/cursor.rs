//! The opaque history cursor: where the next page starts (a token of the request and a
//! window start) and a fingerprint of the request, so that a cursor is only accepted with the
//! request it was made for.

use crate::service::HistoryQuery;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HistoryCursor {
    /// Index of the token in the request.
    pub token: usize,
    /// First window start (Unix seconds) of that token still to send.
    pub from: i64,
    pub fingerprint: u64,
}

impl HistoryCursor {
    /// FNV-1a over the request's tokens, granularity and range.
    pub(crate) fn fingerprint(query: &HistoryQuery) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8]| {
            for byte in bytes {
                hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
            }
            hash = (hash ^ 0xff).wrapping_mul(0x0100_0000_01b3);
        };
        for token in &query.tokens {
            feed(token.chain.as_bytes());
            feed(token.address.as_bytes());
        }
        feed(query.granularity.name().as_bytes());
        feed(&query.start.to_le_bytes());
        feed(&query.end.to_le_bytes());
        hash
    }

    /// 40 hex digits.
    pub(crate) fn encode(&self) -> String {
        format!("{:08x}{:016x}{:016x}", self.token, self.from as u64, self.fingerprint)
    }

    pub(crate) fn decode(text: &str) -> Option<Self> {
        if text.len() != 40 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Self {
            token: usize::from_str_radix(&text[..8], 16).ok()?,
            from: u64::from_str_radix(&text[8..24], 16).ok()? as i64,
            fingerprint: u64::from_str_radix(&text[24..], 16).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let cursor = HistoryCursor { token: 3, from: -5, fingerprint: 0xdead_beef };
        assert_eq!(HistoryCursor::decode(&cursor.encode()), Some(cursor));
        let min = HistoryCursor { token: 0, from: i64::MIN, fingerprint: u64::MAX };
        assert_eq!(HistoryCursor::decode(&min.encode()), Some(min));
        assert_eq!(HistoryCursor::decode("nope"), None);
        assert_eq!(HistoryCursor::decode(&"g".repeat(40)), None);
    }
}
