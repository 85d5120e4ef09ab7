//! How a change's values are kept: each value as a varint header `len << 1 | packed` and
//! its payload, as `sluice_filter::ValueSet` keeps values (a `0x` value of lowercase hex is
//! packed to its bytes: an address takes 21 bytes instead of 42), the list cut into parts of
//! about [`PART_BYTES`], one row each.

use super::corrupt;
use crate::Result;

/// The size past which a change's value list goes on in a new part: a part is one row, and
/// a change may carry tens of millions of values.
pub(crate) const PART_BYTES: usize = 1 << 20;

/// The encoded values a change added and removed, in parts of about [`PART_BYTES`], with
/// their counts. Built from the values before the change's statements run (a set's values
/// are listed from memory, not held across them as strings).
#[derive(Debug, Default)]
pub(crate) struct ChangeLists {
    added: Parts,
    removed: Parts,
}

impl ChangeLists {
    /// The lists of a change that added `added` and removed `removed` (each value once).
    pub(crate) fn of<A, R>(added: A, removed: R) -> Self
    where
        A: IntoIterator,
        A::Item: AsRef<str>,
        R: IntoIterator,
        R::Item: AsRef<str>,
    {
        let mut lists = Self::default();
        added.into_iter().for_each(|value| lists.added.push(value.as_ref()));
        removed.into_iter().for_each(|value| lists.removed.push(value.as_ref()));
        lists
    }

    /// How many values were added and removed.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.added.count, self.removed.count)
    }

    /// The encoded parts of the added and of the removed values (none for an empty list).
    pub(crate) fn into_parts(self) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        (self.added.finish(), self.removed.finish())
    }

    /// The lists of a change that only added `added`.
    pub(crate) fn added<A>(added: A) -> Self
    where
        A: IntoIterator,
        A::Item: AsRef<str>,
    {
        Self::of(added, std::iter::empty::<&str>())
    }

    /// The lists of a change that only removed `removed`.
    pub(crate) fn removed<R>(removed: R) -> Self
    where
        R: IntoIterator,
        R::Item: AsRef<str>,
    {
        Self::of(std::iter::empty::<&str>(), removed)
    }
}

/// One encoded list, in parts.
#[derive(Debug, Default)]
struct Parts {
    done: Vec<Vec<u8>>,
    current: Vec<u8>,
    count: u64,
}

impl Parts {
    fn push(&mut self, value: &str) {
        if self.current.len() >= PART_BYTES {
            self.done.push(std::mem::take(&mut self.current));
        }
        encode_one(&mut self.current, value);
        self.count += 1;
    }

    fn finish(mut self) -> Vec<Vec<u8>> {
        if !self.current.is_empty() {
            self.done.push(self.current);
        }
        self.done
    }
}

/// Longest hex payload packed, in bytes (as `sluice_filter::ValueSet` packs).
const MAX_PACKED: usize = 64;

/// `values`, each as a varint header `len << 1 | packed` and its payload.
pub(crate) fn encode_values(values: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.iter().map(|value| value.len() / 2 + 2).sum());
    for value in values {
        encode_one(&mut out, value);
    }
    out
}

/// Appends one value's header and payload to `out`.
fn encode_one(out: &mut Vec<u8>, value: &str) {
    match packed_hex(value) {
        Some(bytes) => {
            write_varint(out, (bytes.len() << 1) | 1);
            out.extend_from_slice(&bytes);
        }
        None => {
            write_varint(out, value.len() << 1);
            out.extend_from_slice(value.as_bytes());
        }
    }
}

/// The bytes of `0x` followed by an even number (2 to 128) of lowercase hex digits.
fn packed_hex(value: &str) -> Option<Vec<u8>> {
    let digits = value.strip_prefix("0x")?.as_bytes();
    if digits.is_empty() || digits.len() % 2 != 0 || digits.len() > MAX_PACKED * 2 {
        return None;
    }
    let nibble = |digit: u8| match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    };
    digits.chunks_exact(2).map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?)).collect()
}

fn write_varint(out: &mut Vec<u8>, mut value: usize) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The entries of an encoded list: `(packed, payload)` each.
fn entries(bytes: &[u8]) -> impl Iterator<Item = Result<(bool, &[u8])>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let mut tag = 0usize;
        let mut shift = 0;
        loop {
            let Some(&byte) = bytes.get(at) else {
                return Some(Err(corrupt("a value list ends inside a header".to_owned())));
            };
            at += 1;
            if shift > 56 {
                return Some(Err(corrupt("a value header is too long".to_owned())));
            }
            tag |= usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte < 0x80 {
                break;
            }
        }
        let end = at + (tag >> 1);
        let Some(payload) = bytes.get(at..end) else {
            return Some(Err(corrupt("a value list ends inside a value".to_owned())));
        };
        at = end;
        Some(Ok((tag & 1 == 1, payload)))
    })
}

/// Decodes a list written by [`encode_values`].
pub(crate) fn decode_values(bytes: &[u8]) -> Result<Vec<String>> {
    entries(bytes)
        .map(|entry| {
            let (packed, payload) = entry?;
            if packed {
                let mut text = String::with_capacity(2 + payload.len() * 2);
                text.push_str("0x");
                for byte in payload {
                    text.push_str(&format!("{byte:02x}"));
                }
                Ok(text)
            } else {
                String::from_utf8(payload.to_vec())
                    .map_err(|_| corrupt("a value is not UTF-8".to_owned()))
            }
        })
        .collect()
}

/// Whether the encoded list `bytes` holds the one value encoded as `needle`.
pub(crate) fn holds(bytes: &[u8], needle: &[u8]) -> Result<bool> {
    let mut it = entries(needle);
    let Some(Ok((packed, payload))) = it.next() else { return Ok(false) };
    for entry in entries(bytes) {
        if entry? == (packed, payload) {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_lists_round_trip_and_pack_lowercase_hex() {
        let long = "x".repeat(300);
        let values = ["0xabcdef", "0xABCD", "0xabc", "usdc", "", "0x", long.as_str()];
        let bytes = encode_values(&values);
        assert_eq!(decode_values(&bytes).unwrap(), values);
        let address = format!("0x{}", "ab".repeat(20));
        assert_eq!(encode_values(&[&address]).len(), 21);
        assert!(holds(&bytes, &encode_values(&["usdc"])).unwrap());
        assert!(!holds(&bytes, &encode_values(&["0xabcd"])).unwrap());
        assert!(decode_values(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn long_lists_are_split_into_parts_that_decode_back_in_order() {
        let values: Vec<String> = (0..120_000).map(|n| format!("0x{n:040x}")).collect();
        let lists = ChangeLists::of(&values, ["gone"]);
        assert_eq!((lists.added.count, lists.removed.count), (120_000, 1));
        let parts = lists.added.finish();
        assert_eq!(parts.len(), 3, "21 bytes a value, parts of 1 MiB");
        let decoded: Vec<String> =
            parts.iter().flat_map(|part| decode_values(part).unwrap()).collect();
        assert_eq!(decoded, values);
        assert!(ChangeLists::default().added.finish().is_empty(), "no values, no part");
    }
}
