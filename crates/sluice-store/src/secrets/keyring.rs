//! Sealing secret values at rest: ChaCha20-Poly1305 under a 32-byte key from the server's
//! settings, with the secret's organization and name as associated data (a sealed value
//! copied to another row does not open). A sealed value is `nonce (12 bytes) ‖ ciphertext ‖
//! tag (16 bytes)`, stored with the id of its key so that a rotation can find what to reseal.
//!
//! Rotation: start the server with the new key as the current key and the old one among the
//! previous keys; it reseals every value under the new key at start
//! ([`crate::secrets::Secrets::reseal`]); then the old key can be dropped.

use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};

use super::SecretsError;

const NONCE_LEN: usize = 12;

/// One 32-byte key.
#[derive(Clone)]
pub struct SecretsKey {
    bytes: [u8; 32],
    id: String,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl SecretsKey {
    /// A key from 64 hex characters.
    ///
    /// # Errors
    /// [`SecretsError::BadKey`] when the text is not 64 hex characters.
    pub fn from_hex(text: &str) -> Result<Self, SecretsError> {
        let text = text.trim();
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(SecretsError::BadKey("a secrets key is 64 hex characters (32 bytes)"));
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| {
                SecretsError::BadKey("a secrets key is 64 hex characters (32 bytes)")
            })?;
        }
        Ok(Self::from_bytes(bytes))
    }

    fn from_bytes(bytes: [u8; 32]) -> Self {
        let digest = Sha256::digest(bytes);
        let id = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Self { bytes, id }
    }

    /// A new random key.
    ///
    /// # Errors
    /// When the system has no randomness to give.
    pub fn generate() -> Result<Self, SecretsError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|_| SecretsError::BadKey("no system randomness"))?;
        Ok(Self::from_bytes(bytes))
    }

    /// The key as 64 hex characters.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A short public name of the key (a digest prefix), stored beside what it sealed.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key in `path` (64 hex characters), created with a new random key (mode 0600)
    /// when the file does not exist.
    ///
    /// # Errors
    /// An unreadable or malformed file, or one that cannot be created.
    pub fn load_or_create(path: &Path) -> Result<Self, SecretsError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::from_hex(&text),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate()?;
                write_private(path, &format!("{}\n", key.to_hex()))
                    .map_err(|error| SecretsError::KeyFile(path.display().to_string(), error))?;
                Ok(key)
            }
            Err(error) => Err(SecretsError::KeyFile(path.display().to_string(), error)),
        }
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// The current key and the previous ones still accepted for opening.
#[derive(Debug, Clone)]
pub struct Keyring {
    current: SecretsKey,
    previous: Vec<SecretsKey>,
}

/// A value sealed under one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub bytes: Vec<u8>,
}

impl Keyring {
    pub fn new(current: SecretsKey, previous: Vec<SecretsKey>) -> Self {
        Self { current, previous }
    }

    pub fn current_id(&self) -> &str {
        self.current.id()
    }

    /// Seals `value` under the current key, bound to `org_id` and `name`.
    ///
    /// # Errors
    /// When the system has no randomness for a nonce.
    pub fn seal(&self, org_id: &str, name: &str, value: &[u8]) -> Result<Sealed, SecretsError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|_| SecretsError::BadKey("no system randomness"))?;
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&self.current.bytes));
        let aad = associated(org_id, name);
        let sealed = cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: value, aad: &aad })
            .map_err(|_| SecretsError::BadKey("sealing failed"))?;
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        Ok(Sealed { key_id: self.current.id().to_owned(), bytes })
    }

    /// Opens what [`Keyring::seal`] sealed for `org_id` and `name`.
    ///
    /// # Errors
    /// [`SecretsError::UnknownKey`] when its key is neither current nor previous;
    /// [`SecretsError::Tampered`] when it does not open (altered, or moved to another row).
    pub fn open(&self, org_id: &str, name: &str, sealed: &Sealed) -> Result<Vec<u8>, SecretsError> {
        let key = std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|key| key.id() == sealed.key_id)
            .ok_or_else(|| SecretsError::UnknownKey(sealed.key_id.clone()))?;
        if sealed.bytes.len() < NONCE_LEN {
            return Err(SecretsError::Tampered(name.to_owned()));
        }
        let (nonce, ciphertext) = sealed.bytes.split_at(NONCE_LEN);
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&key.bytes));
        let aad = associated(org_id, name);
        cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ciphertext, aad: &aad })
            .map_err(|_| SecretsError::Tampered(name.to_owned()))
    }
}

fn associated(org_id: &str, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(org_id.len() + name.len() + 1);
    aad.extend_from_slice(org_id.as_bytes());
    aad.push(0);
    aad.extend_from_slice(name.as_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(fill: u8) -> SecretsKey {
        SecretsKey::from_bytes([fill; 32])
    }

    #[test]
    fn a_sealed_value_opens_only_for_its_org_and_name_and_never_shows_the_value() {
        let ring = Keyring::new(key(1), Vec::new());
        let sealed = ring.seal("org", "hook", b"s3cret-value").unwrap();
        assert!(!sealed.bytes.windows(12).any(|w| w == b"s3cret-value"));
        assert_eq!(ring.open("org", "hook", &sealed).unwrap(), b"s3cret-value");
        assert!(matches!(ring.open("org", "other", &sealed), Err(SecretsError::Tampered(_))));
        assert!(matches!(ring.open("org2", "hook", &sealed), Err(SecretsError::Tampered(_))));
        let mut altered = sealed.clone();
        *altered.bytes.last_mut().unwrap() ^= 1;
        assert!(matches!(ring.open("org", "hook", &altered), Err(SecretsError::Tampered(_))));
    }

    #[test]
    fn a_rotated_keyring_opens_old_values_and_seals_under_the_new_key() {
        let old = Keyring::new(key(1), Vec::new());
        let sealed = old.seal("org", "hook", b"v").unwrap();
        let rotated = Keyring::new(key(2), vec![key(1)]);
        assert_eq!(rotated.open("org", "hook", &sealed).unwrap(), b"v");
        assert_eq!(rotated.seal("org", "hook", b"v").unwrap().key_id, key(2).id());
        let without_old = Keyring::new(key(2), Vec::new());
        assert!(matches!(
            without_old.open("org", "hook", &sealed),
            Err(SecretsError::UnknownKey(id)) if id == key(1).id()
        ));
    }

    #[test]
    fn keys_read_back_from_hex_and_files_are_created_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        let made = SecretsKey::load_or_create(&path).unwrap();
        let again = SecretsKey::load_or_create(&path).unwrap();
        assert_eq!(made.id(), again.id());
        assert_eq!(SecretsKey::from_hex(&made.to_hex()).unwrap().id(), made.id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert!(SecretsKey::from_hex("abc").is_err());
        assert!(!format!("{made:?}").contains(&made.to_hex()));
    }
}
