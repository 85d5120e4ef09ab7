//! Base58 in Bitcoin's alphabet, as Solana writes keys, hashes and signatures.

/// The alphabet: digits and letters without `0`, `O`, `I` and `l`.
pub const ALPHABET: &[u8; 58] = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";

/// `bytes` in base58: each leading zero byte is a `1`, the rest the big-endian number.
pub fn encode(bytes: &[u8]) -> String {
    let zeros = bytes.iter().take_while(|&&b| b == 0).count();
    // Little-endian base-58 digits of the big-endian number `bytes`.
    let mut digits: Vec<u8> = Vec::with_capacity(bytes.len() * 138 / 100 + 1);
    for &byte in &bytes[zeros..] {
        let mut carry = u32::from(byte);
        for digit in &mut digits {
            carry += u32::from(*digit) << 8;
            *digit = (carry % 58) as u8;
            carry /= 58;
        }
        while carry > 0 {
            digits.push((carry % 58) as u8);
            carry /= 58;
        }
    }
    let mut text = String::with_capacity(zeros + digits.len());
    text.extend(std::iter::repeat_n('1', zeros));
    text.extend(digits.iter().rev().map(|&d| char::from(ALPHABET[usize::from(d)])));
    text
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn known_values() {
        assert_eq!(encode(&[0; 32]), "11111111111111111111111111111111");
        assert_eq!(encode(b"hello world"), "StV1DL6CwTryKyV");
        assert_eq!(encode(&[0, 0, 1]), "112");
        assert_eq!(encode(&[]), "");
    }
}
