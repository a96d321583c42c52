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

/// Slows guessing: after `limit` failed sign-ins for one account, or from
/// one address, within `window`, further attempts for it are refused until
/// the oldest failure leaves the window. Kept in memory: each harness
/// instance counts the attempts it sees.
pub struct SignInThrottle {
    limit: usize,
    window: std::time::Duration,
    failures: std::sync::Mutex<std::collections::HashMap<String, Vec<std::time::Instant>>>,
}

impl SignInThrottle {
    /// Five failures in fifteen minutes.
    pub fn standard() -> Self {
        SignInThrottle::new(5, std::time::Duration::from_secs(15 * 60))
    }

    pub fn new(limit: usize, window: std::time::Duration) -> Self {
        SignInThrottle {
            limit,
            window,
            failures: Default::default(),
        }
    }

    /// `Err(wait)` when any of `keys` (an account, an address) is over the
    /// limit: how long until one more attempt is allowed.
    pub fn check(&self, keys: &[String]) -> Result<(), std::time::Duration> {
        let now = std::time::Instant::now();
        let mut failures = self.failures.lock().expect("throttle lock");
        let mut wait = std::time::Duration::ZERO;
        for key in keys {
            if let Some(times) = failures.get_mut(key) {
                times.retain(|t| now.duration_since(*t) < self.window);
                if times.len() >= self.limit {
                    let oldest = times[times.len() - self.limit];
                    wait = wait.max(self.window - now.duration_since(oldest));
                }
            }
        }
        if wait.is_zero() {
            Ok(())
        } else {
            Err(wait)
        }
    }

    pub fn failed(&self, keys: &[String]) {
        let now = std::time::Instant::now();
        let mut failures = self.failures.lock().expect("throttle lock");
        for key in keys {
            failures.entry(key.clone()).or_default().push(now);
        }
    }

    /// A successful sign-in clears the account's count (not the address's).
    pub fn succeeded(&self, account: &str) {
        self.failures.lock().expect("throttle lock").remove(account);
    }
}

#[cfg(test)]
mod throttle_tests {
    use super::SignInThrottle;
    use std::time::Duration;

    fn keys(account: &str, address: &str) -> Vec<String> {
        vec![format!("account:{account}"), format!("address:{address}")]
    }

    #[test]
    fn the_sixth_attempt_within_the_window_waits() {
        let throttle = SignInThrottle::new(5, Duration::from_secs(900));
        let dana = keys("dana", "10.0.0.1");
        for _ in 0..5 {
            assert!(throttle.check(&dana).is_ok());
            throttle.failed(&dana);
        }
        let wait = throttle.check(&dana).unwrap_err();
        assert!(wait > Duration::from_secs(890) && wait <= Duration::from_secs(900));
        // The same address trying another account waits too; another
        // address for another account does not.
        assert!(throttle.check(&keys("lee", "10.0.0.1")).is_err());
        assert!(throttle.check(&keys("lee", "10.0.0.2")).is_ok());
    }

    #[test]
    fn failures_leave_the_window_and_success_clears_the_account() {
        let throttle = SignInThrottle::new(2, Duration::from_millis(50));
        let dana = keys("dana", "10.0.0.1");
        throttle.failed(&dana);
        throttle.failed(&dana);
        assert!(throttle.check(&dana).is_err());
        std::thread::sleep(Duration::from_millis(60));
        assert!(throttle.check(&dana).is_ok());
        throttle.failed(&dana[..1]);
        throttle.failed(&dana[..1]);
        throttle.succeeded("account:dana");
        assert!(throttle.check(&dana[..1]).is_ok());
    }
}
