//! Where a client finds the cluster's shared token (docs/security.md): an explicit
//! [`crate::StoreConfig::auth_token`], else `MC_AUTH_TOKEN`, else the file named by
//! `MC_AUTH_TOKEN_FILE`. The same token authenticates to the master and keys this client's
//! data-port capabilities.

use mooncake_common::{AuthToken, AUTH_TOKEN_ENV, AUTH_TOKEN_FILE_ENV};
use std::path::Path;

/// Reads a token file (surrounding whitespace trimmed); the message names the file and why.
pub fn read_token_file(path: &Path) -> Result<AuthToken, String> {
    let bytes = std::fs::read(path)
        .map_err(|error| format!("cannot read the token file {}: {error}", path.display()))?;
    AuthToken::from_bytes(&bytes).map_err(|error| format!("token file {}: {error}", path.display()))
}

/// The token of the environment: `MC_AUTH_TOKEN`, else the file named by `MC_AUTH_TOKEN_FILE`;
/// `Ok(None)` when neither is set (or both are empty). A set but unusable value is an error,
/// never silently ignored: a client meant to authenticate must not run without.
pub fn token_from_env() -> Result<Option<AuthToken>, String> {
    if let Some(value) = std::env::var_os(AUTH_TOKEN_ENV).filter(|v| !v.is_empty()) {
        use std::os::unix::ffi::OsStrExt;
        return AuthToken::from_bytes(value.as_bytes())
            .map(Some)
            .map_err(|error| format!("{AUTH_TOKEN_ENV}: {error}"));
    }
    match std::env::var_os(AUTH_TOKEN_FILE_ENV).filter(|v| !v.is_empty()) {
        Some(path) => read_token_file(Path::new(&path))
            .map(Some)
            .map_err(|error| format!("{AUTH_TOKEN_FILE_ENV}: {error}")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn token_files_are_read_trimmed_and_checked() {
        let dir = std::env::temp_dir().join(format!("mc-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("token");
        std::fs::write(&good, "0123456789abcdef0123\n").unwrap();
        let token = read_token_file(&good).unwrap();
        assert_eq!(token.expose(), b"0123456789abcdef0123");
        let short = dir.join("short");
        std::fs::write(&short, "abc\n").unwrap();
        let error = read_token_file(&short).unwrap_err();
        assert!(error.contains("short") && error.contains("16"), "{error}");
        let error = read_token_file(&dir.join("missing")).unwrap_err();
        assert!(error.contains("missing"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
