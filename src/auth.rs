//! Credentials: support leads' passwords (Argon2id) and agents' bearer
//! tokens (random, stored as SHA-256 only: a token is long and random, so a
//! fast hash is enough and lets each API call check it cheaply).

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::Argon2;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// What every issued token starts with, so a leaked one is recognisable.
pub const TOKEN_PREFIX: &str = "sh_";

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("password must be at least {min} characters")]
    PasswordTooShort { min: usize },
    #[error("cannot hash password: {0}")]
    Hash(String),
}

pub const MIN_PASSWORD_LEN: usize = 8;

pub fn hash_password(password: &str) -> Result<String, AuthError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(AuthError::PasswordTooShort {
            min: MIN_PASSWORD_LEN,
        });
    }
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

/// False for a wrong password and for a hash this build cannot read.
pub fn verify_password(password: &str, stored_hash: &str) -> bool {
    PasswordHash::new(stored_hash)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

/// A fresh bearer token: 32 random bytes, hex, with a recognisable prefix.
pub fn new_api_token() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    let mut token = String::from(TOKEN_PREFIX);
    for byte in bytes {
        token.push_str(&format!("{byte:02x}"));
    }
    token
}

/// A password for a generated login (the demo's admin): 16 characters from
/// an alphabet without look-alikes, about 90 bits.
pub fn new_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut bytes = [0u8; 16];
    OsRng.fill_bytes(&mut bytes);
    bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// What the database keeps of a token.
pub fn token_hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_verifies_against_its_hash_only() {
        let hash = hash_password("correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &hash));
        assert!(!verify_password("correct horse!", &hash));
        assert!(!verify_password("correct horse", "not a hash"));
    }

    #[test]
    fn short_passwords_are_refused_with_the_minimum() {
        let err = hash_password("short").unwrap_err();
        assert_eq!(err.to_string(), "password must be at least 8 characters");
    }

    #[test]
    fn tokens_are_random_and_stored_hashed() {
        let a = new_api_token();
        let b = new_api_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        let hash = token_hash(&a);
        assert_eq!(hash.len(), 64);
        assert!(!hash.contains(&a[TOKEN_PREFIX.len()..]));
        assert_eq!(hash, token_hash(&a));
    }
}
