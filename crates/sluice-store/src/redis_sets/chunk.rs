//! The format of one chunk of a set's log: [`ChunkWriter`] builds one, [`decode`] reads it.

/// One entry of a log chunk.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Entry<'a> {
    /// The value was added with this seq.
    Added(i64, &'a str),
    /// The value was removed.
    Removed(&'a str),
}

/// Builds one chunk of a log. An add chunk is `a` then, per entry, its seq less the entry
/// before's (the first: its seq) and the value, length first; a remove chunk is `r`, its
/// seq, then its values, length first. Numbers are LEB128 varints.
#[derive(Debug)]
pub(super) struct ChunkWriter {
    bytes: Vec<u8>,
    /// The seq of the last entry (of a remove chunk: its seq).
    last: i64,
    pub(super) len: usize,
    removal: bool,
}

impl ChunkWriter {
    pub(super) fn added() -> Self {
        Self { bytes: vec![b'a'], last: 0, len: 0, removal: false }
    }

    pub(super) fn removed(seq: i64) -> Self {
        let mut bytes = vec![b'r'];
        put_varint(&mut bytes, seq.unsigned_abs());
        Self { bytes, last: seq, len: 0, removal: true }
    }

    /// Appends `value` under `seq` (of an add chunk: above the last entry's).
    pub(super) fn push(&mut self, seq: i64, value: &str) {
        if !self.removal {
            put_varint(&mut self.bytes, (seq - self.last).unsigned_abs());
            self.last = seq;
        }
        put_varint(&mut self.bytes, value.len() as u64);
        self.bytes.extend_from_slice(value.as_bytes());
        self.len += 1;
    }

    /// The chunk and its score (its last seq); the writer starts a new add chunk.
    pub(super) fn take(&mut self) -> (Vec<u8>, i64) {
        let score = self.last;
        let bytes = std::mem::replace(&mut self.bytes, vec![b'a']);
        (self.last, self.len, self.removal) = (0, 0, false);
        (bytes, score)
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(bytes: &mut &[u8]) -> std::result::Result<u64, String> {
    let mut value = 0_u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or("a number past the chunk's end")?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a number of more than 64 bits".to_owned())
}

/// Hands every entry of `chunk` to `f`, in order.
pub(super) fn decode<'a>(
    chunk: &'a [u8],
    mut f: impl FnMut(Entry<'a>),
) -> std::result::Result<(), String> {
    let (&kind, mut rest) = chunk.split_first().ok_or("an empty chunk")?;
    let removal = match kind {
        b'a' => false,
        b'r' => true,
        other => return Err(format!("a chunk of unknown kind {other}")),
    };
    let mut seq = if removal { take_varint(&mut rest)? } else { 0 };
    while !rest.is_empty() {
        if !removal {
            seq += take_varint(&mut rest)?;
        }
        let len = usize::try_from(take_varint(&mut rest)?).unwrap_or(usize::MAX);
        if len > rest.len() {
            return Err("a value past the chunk's end".to_owned());
        }
        let (value, tail) = rest.split_at(len);
        rest = tail;
        let value = std::str::from_utf8(value).map_err(|e| format!("a value: {e}"))?;
        let seq = i64::try_from(seq).map_err(|_| "a seq past i64".to_owned())?;
        f(if removal { Entry::Removed(value) } else { Entry::Added(seq, value) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{ChunkWriter, decode};

    #[test]
    fn chunks_read_back_as_written() {
        let mut added = ChunkWriter::added();
        added.push(7, "0xab");
        added.push(8, "");
        added.push(300, "ünï");
        let (bytes, score) = added.take();
        assert_eq!(score, 300);
        let mut seen = Vec::new();
        decode(&bytes, |entry| seen.push(format!("{entry:?}"))).unwrap();
        assert_eq!(seen, ["Added(7, \"0xab\")", "Added(8, \"\")", "Added(300, \"ünï\")"]);
        // The writer goes on with a new add chunk, its first seq written whole.
        added.push(1 << 40, "x");
        let (bytes, score) = added.take();
        assert_eq!(score, 1 << 40);
        let mut seen = Vec::new();
        decode(&bytes, |entry| seen.push(format!("{entry:?}"))).unwrap();
        assert_eq!(seen, [format!("Added({}, \"x\")", 1_i64 << 40)]);

        let mut removed = ChunkWriter::removed(301);
        removed.push(301, "0xab");
        removed.push(301, "ünï");
        let (bytes, score) = removed.take();
        assert_eq!(score, 301);
        let mut seen = Vec::new();
        decode(&bytes, |entry| seen.push(format!("{entry:?}"))).unwrap();
        assert_eq!(seen, ["Removed(\"0xab\")", "Removed(\"ünï\")"]);
    }

    #[test]
    fn a_damaged_chunk_is_an_error_not_a_panic() {
        let mut added = ChunkWriter::added();
        added.push(1, "0xabcdef");
        let (bytes, _) = added.take();
        // Cut anywhere past its kind, it ends inside an entry.
        for end in 2..bytes.len() {
            assert!(decode(&bytes[..end], |_| ()).is_err(), "cut at {end}");
        }
        assert!(decode(b"", |_| ()).is_err());
        assert!(decode(b"z", |_| ()).is_err());
        assert!(decode(&[b'a', 1, 2, 0xff, 0xfe], |_| ()).is_err(), "not UTF-8");
        assert!(
            decode(&[b'a', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1], |_| ())
                .is_err()
        );
    }
}
