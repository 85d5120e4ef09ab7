//! Text forms of chain values: `0x` hex, base58, and token amounts as decimal strings.

use rand::Rng;
use rand::rngs::StdRng;

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `0x` + lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 + bytes.len() * 2);
    text.push_str("0x");
    for byte in bytes {
        text.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(HEX_DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

/// `0x` + `2 * n` random lowercase hex digits.
pub(crate) fn random_hex(rng: &mut StdRng, n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rng.fill(bytes.as_mut_slice());
    hex(&bytes)
}

/// A random 20-byte EVM (or Hyperliquid) address.
pub(crate) fn random_address(rng: &mut StdRng) -> String {
    random_hex(rng, 20)
}

/// A random 32-byte hash.
pub(crate) fn random_hash(rng: &mut StdRng) -> String {
    random_hex(rng, 32)
}

/// Bitcoin-alphabet base58, as Solana writes keys, hashes and signatures.
pub(crate) fn base58(bytes: &[u8]) -> String {
    sluice_core::base58::encode(bytes)
}

/// Base58 of `n` random bytes (32 for a Solana key or hash, 64 for a signature).
pub(crate) fn random_base58(rng: &mut StdRng, n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rng.fill(bytes.as_mut_slice());
    base58(&bytes)
}

/// `raw` base units of a token with `decimals` as a decimal string without trailing zeros:
/// `format_units(1_234_500, 6)` is `"1.2345"`.
pub(crate) fn format_units(raw: u128, decimals: u8) -> String {
    let scale = 10u128.pow(u32::from(decimals));
    let (whole, fraction) = (raw / scale, raw % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:0width$}", width = usize::from(decimals));
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// A 32-byte ABI word (64 hex digits, no `0x`) holding `value`, sign-extended.
pub(crate) fn word(value: i128) -> String {
    if value < 0 { format!("{:f>64x}", value as u128) } else { format!("{value:064x}") }
}

/// A 32-byte ABI word holding an unsigned `value`.
pub(crate) fn uword(value: u128) -> String {
    format!("{value:064x}")
}

/// An address as an indexed topic: left-padded to 32 bytes.
pub(crate) fn address_topic(address: &str) -> String {
    format!("0x{:0>64}", address.trim_start_matches("0x"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base58_matches_known_encodings() {
        assert_eq!(base58(&[0u8; 32]), "11111111111111111111111111111111");
        assert_eq!(base58(b"hello world"), "StV1DL6CwTryKyV");
        assert_eq!(base58(&[0, 0, 1]), "112");
    }

    #[test]
    fn amounts_are_exact_decimal_strings() {
        assert_eq!(format_units(1_234_500, 6), "1.2345");
        assert_eq!(format_units(5_000_000, 6), "5");
        assert_eq!(format_units(1, 18), "0.000000000000000001");
        assert_eq!(format_units(42, 0), "42");
    }

    #[test]
    fn abi_words_are_sign_extended_and_topics_padded() {
        assert_eq!(word(-1), "f".repeat(64));
        assert_eq!(word(255), format!("{}ff", "0".repeat(62)));
        assert_eq!(uword(1).len(), 64);
        let topic = address_topic("0x4200000000000000000000000000000000000006");
        assert_eq!(topic.len(), 66);
        assert!(topic.ends_with("4200000000000000000000000000000000000006"));
        assert_eq!(hex(&[0xab, 0x01]), "0xab01");
    }
}
