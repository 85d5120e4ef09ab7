//! Organization secrets as values: a [`SecretValue`] never shows its text in `Debug` or
//! `Display`, so a secret cannot reach a log line or an error message by formatting.

use std::collections::BTreeMap;

/// The plain value of an organization secret.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The value itself: only for the system that needs it (a signature, a login).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// A secret as a deployment resolved it: its value and the revision it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSecret {
    pub value: SecretValue,
    /// Changes on every write of the secret.
    pub revision: String,
}

/// The secrets a pipeline's sinks name, by secret name.
pub type ResolvedSecrets = BTreeMap<String, ResolvedSecret>;
