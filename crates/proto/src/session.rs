//! Sessions as capabilities: a client picks a random secret and says `hello` with it; the
//! session's id is a digest of the secret, so whoever holds the secret can resume the
//! session, on any node, and nobody who only saw its id can. An unnamed object's key is a
//! digest of the secret and the object's number: as unguessable as the secret, and the same
//! when a retried function makes its calls again.

use sha2::{Digest, Sha256};

/// Ids of sessions that have a secret start with this; `hello` with such an id and without
/// its secret is refused.
pub const SECRET_SESSION_PREFIX: char = '#';
/// The shortest secret taken (the SDKs use 128 random bits as 32 hex digits).
pub const MIN_SECRET_LEN: usize = 16;

/// The id of the session whose secret is `secret`.
pub fn session_id(secret: &str) -> String {
    format!("{SECRET_SESSION_PREFIX}{}", digest(&["spindle session", secret]))
}

/// The key of the `n`th unnamed object of the session whose secret is `secret`.
pub fn unnamed_key(secret: &str, n: u64) -> String {
    format!("~{}", digest(&["spindle unnamed object", secret, &n.to_string()]))
}

/// The first 128 bits of SHA-256 over `parts` (each ended by a zero byte), in hex.
fn digest(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0u8]);
    }
    hasher.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_keys_are_fixed_digests_of_the_secret() {
        // The Python SDK derives the same (tests/test_security.py checks it against the server).
        let secret = "0123456789abcdef0123456789abcdef";
        let id = session_id(secret);
        assert!(id.starts_with(SECRET_SESSION_PREFIX) && id.len() == 33, "{id}");
        assert_eq!(id, session_id(secret), "the same on every node");
        assert_ne!(id, session_id("0123456789abcdef0123456789abcdee"));
        assert_ne!(unnamed_key(secret, 1), unnamed_key(secret, 2));
        assert!(unnamed_key(secret, 1).starts_with('~'));
        assert!(
            !unnamed_key(secret, 1).contains(&id[1..]),
            "the key tells nothing of the session"
        );
    }
}
