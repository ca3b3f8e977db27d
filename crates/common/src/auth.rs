//! The optional shared secret of a cluster (docs/security.md): the master requires it on the RPC
//! handshake and the admin HTTP mutations, and store nodes derive their data-port capabilities
//! from it.
//!
//! [`AuthToken`] holds the secret bytes, never prints them (`Debug` is redacted) and compares a
//! presented token in time that does not depend on the secret's content. Reading the token from
//! a file or the environment is done by the crates that own I/O (the server and the client);
//! this module only validates the bytes they read.

use std::fmt;
use std::sync::Arc;

/// Environment variable holding the token itself (clients: the Python binding, the CLI, every
/// `StoreClient`).
pub const AUTH_TOKEN_ENV: &str = "MC_AUTH_TOKEN";
/// Environment variable naming a file that holds the token (read when `MC_AUTH_TOKEN` is unset).
pub const AUTH_TOKEN_FILE_ENV: &str = "MC_AUTH_TOKEN_FILE";
/// Shortest token accepted, in bytes: a token is a secret, not a password (e.g.
/// `openssl rand -hex 32` gives 64).
pub const MIN_TOKEN_BYTES: usize = 16;
/// Longest token accepted, in bytes (it travels in one small RPC frame).
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Why token bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is {0} bytes after trimming; at least {MIN_TOKEN_BYTES} are required (e.g. `openssl rand -hex 32`)")]
    TooShort(usize),
    #[error("the token is {0} bytes; at most {MAX_TOKEN_BYTES} are accepted")]
    TooLong(usize),
}

/// A shared secret. Cheap to clone (the bytes are shared).
#[derive(Clone)]
pub struct AuthToken {
    secret: Arc<[u8]>,
}

impl AuthToken {
    /// A token from the bytes of a token file or variable: surrounding ASCII whitespace (the
    /// newline an editor or `echo` adds) is trimmed, then the length is checked.
    pub fn from_bytes(bytes: &[u8]) -> Result<AuthToken, TokenError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < MIN_TOKEN_BYTES {
            return Err(TokenError::TooShort(trimmed.len()));
        }
        if trimmed.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLong(trimmed.len()));
        }
        Ok(AuthToken {
            secret: Arc::from(trimmed),
        })
    }

    /// The secret bytes (to send in the RPC handshake, or to key an HMAC).
    pub fn expose(&self) -> &[u8] {
        &self.secret
    }

    /// Whether `presented` is this token. The time taken depends on `presented`'s length only:
    /// every byte of it is compared (against the secret, cycled) and a length mismatch is folded
    /// into the same result, so neither a prefix match nor the secret's content shows in the
    /// timing.
    pub fn verify(&self, presented: &[u8]) -> bool {
        constant_time_eq(&self.secret, presented)
    }
}

/// Compares `secret` and `presented` in time that depends on `presented.len()` only.
fn constant_time_eq(secret: &[u8], presented: &[u8]) -> bool {
    if secret.is_empty() {
        return false;
    }
    let mut diff = u8::from(secret.len() != presented.len());
    for (i, byte) in presented.iter().enumerate() {
        diff |= secret[i % secret.len()] ^ byte;
        // Keeps the optimizer from ending the loop early once `diff` is non-zero.
        diff = std::hint::black_box(diff);
    }
    diff == 0
}

impl PartialEq for AuthToken {
    fn eq(&self, other: &AuthToken) -> bool {
        self.verify(&other.secret)
    }
}

impl Eq for AuthToken {}

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthToken(<{} bytes, redacted>)", self.secret.len())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_bounded() {
        let token = AuthToken::from_bytes(b"  0123456789abcdef\n").unwrap();
        assert_eq!(token.expose(), b"0123456789abcdef");
        assert_eq!(
            AuthToken::from_bytes(b"short\n").unwrap_err(),
            TokenError::TooShort(5)
        );
        assert_eq!(
            AuthToken::from_bytes(&[b'x'; MAX_TOKEN_BYTES + 1]).unwrap_err(),
            TokenError::TooLong(MAX_TOKEN_BYTES + 1)
        );
        assert!(AuthToken::from_bytes(&[b'x'; MAX_TOKEN_BYTES]).is_ok());
    }

    #[test]
    fn verify_accepts_only_the_exact_token() {
        let token = AuthToken::from_bytes(b"0123456789abcdef").unwrap();
        assert!(token.verify(b"0123456789abcdef"));
        for wrong in [
            &b""[..],
            b"0123456789abcde",
            b"0123456789abcdeF",
            b"0123456789abcdef0",
            b"0123456789abcdef0123456789abcdef",
            b"x123456789abcdef",
        ] {
            assert!(!token.verify(wrong), "{:?}", String::from_utf8_lossy(wrong));
        }
        assert_eq!(token, AuthToken::from_bytes(b"0123456789abcdef\n").unwrap());
        assert_ne!(token, AuthToken::from_bytes(b"0123456789abcdeX").unwrap());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let token = AuthToken::from_bytes(b"very-secret-token-bytes").unwrap();
        let shown = format!("{token:?}");
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}
