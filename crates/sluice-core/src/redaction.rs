//! Showing a URL someone typed — valid or not — without the secrets it may carry, so that an
//! error can say what was tried.
//!
//! Two strengths: [`redact_password`] for URLs whose other parts are names the operator
//! chose (a database, a Redis, a bucket), and [`redact_url`] for URLs from a provider, which
//! put API keys in the path or the query. Neither needs the text to parse: a mistyped URL is
//! exactly the one an error must show.

/// Shortest path segment taken for a key (providers put 32-character keys in the path:
/// `https://base-mainnet.g.alchemy.com/v2/<key>`).
const KEY_LOOKING_LEN: usize = 16;

/// `text` with the password of its user info (`user:password@`) replaced by `***`.
///
/// ```
/// use sluice_core::redaction::redact_password;
/// assert_eq!(redact_password("postgres://u:pw@h:5432/db"), "postgres://u:***@h:5432/db");
/// assert_eq!(redact_password("postgres:/u:pw@h"), "postgres:/u:***@h");
/// assert_eq!(redact_password("not-a-url"), "not-a-url");
/// ```
pub fn redact_password(text: &str) -> String {
    let (head, authority, rest) = split_authority(text);
    format!("{head}{}{rest}", hide_password(authority))
}

/// `text` with what may be a secret hidden: the password of the user info, the query and
/// fragment (`?***`), and path segments of 16 characters or more.
///
/// ```
/// use sluice_core::redaction::redact_url;
/// assert_eq!(
///     redact_url("https://base-mainnet.g.alchemy.com/v2/abcdefghijklmnopqrstuvwxyz"),
///     "https://base-mainnet.g.alchemy.com/v2/***"
/// );
/// assert_eq!(redact_url("https://node.example/?apikey=secret"), "https://node.example?***");
/// assert_eq!(redact_url("not-a-url"), "not-a-url");
/// assert_eq!(redact_url("node.example/v2/abcdefghijklmnopqrstuvwxyz"), "node.example/v2/***");
/// ```
pub fn redact_url(text: &str) -> String {
    let has_query = text.contains(['?', '#']);
    let text = text.split(['?', '#']).next().unwrap_or("");
    let (head, authority, path) = split_authority(text);
    let authority = hide_password(authority);
    let path: Vec<&str> = path
        .split('/')
        .map(|segment| if segment.len() >= KEY_LOOKING_LEN { "***" } else { segment })
        .collect();
    let query = if has_query { "?***" } else { "" };
    if path.iter().all(|segment| segment.is_empty()) {
        format!("{head}{authority}{query}")
    } else {
        format!("{head}{authority}{}{query}", path.join("/"))
    }
}

/// `(scheme and "://", authority, the rest from its first '/')`. Without `://` the
/// authority is the text up to the first '/' (a URL typed without its scheme), or, with
/// user info, starts after the last '/' before the '@': `scheme:/user:password@host` loses
/// its password too.
fn split_authority(text: &str) -> (&str, &str, &str) {
    let (head, rest) = match text.find("://") {
        Some(at) => text.split_at(at + 3),
        None => match text.rfind('@') {
            // No `://`, but user info: the authority starts after the last '/' before '@'.
            Some(at) => text.split_at(text[..at].rfind('/').map_or(0, |slash| slash + 1)),
            None => ("", text),
        },
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    (head, authority, path)
}

fn hide_password(authority: &str) -> String {
    match authority.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_whatever_the_shape_of_the_text() {
        assert_eq!(redact_password("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact_password("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_password("sqlite://./data/sluice.db"), "sqlite://./data/sluice.db");
        assert_eq!(
            redact_password("redis://:pw@h:6379/0?prefix=p"),
            "redis://:***@h:6379/0?prefix=p"
        );
        assert_eq!(redact_password("rediss-typo//u:pw@h"), "rediss-typo//u:***@h");
        assert_eq!(redact_password("u:pw@h"), "u:***@h");
        // A database name stays readable however long it is.
        assert_eq!(
            redact_password("postgres://u:pw@127.0.0.1:5433/sluice_reliability_12345"),
            "postgres://u:***@127.0.0.1:5433/sluice_reliability_12345"
        );
    }

    #[test]
    fn provider_urls_lose_keys_in_the_path_the_query_and_the_user_info() {
        assert_eq!(
            redact_url("https://user:pw@node.example/rpc"),
            "https://user:***@node.example/rpc"
        );
        assert_eq!(redact_url("http://127.0.0.1:8545"), "http://127.0.0.1:8545");
        assert_eq!(redact_url("https://h/hook#0123456789abcdef"), "https://h/hook?***");
        assert_eq!(redact_url("not a url at all"), "not a url at all");
        assert_eq!(
            redact_url("htps:/node.example/v2/0123456789abcdef"),
            "htps:/node.example/v2/***"
        );
        assert_eq!(redact_url(""), "");
    }
}
