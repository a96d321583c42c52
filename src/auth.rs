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
    #[error("password must be at most {max} bytes")]
    PasswordTooLong { max: usize },
    #[error("that password is one of the first guessers try; choose another")]
    CommonPassword,
    #[error("cannot hash password: {0}")]
    Hash(String),
}

pub const MIN_PASSWORD_LEN: usize = 8;

/// Passwords of eight characters or more that guessers try first.
const COMMON_PASSWORDS: [&str; 40] = [
    "password",
    "password1",
    "password12",
    "password123",
    "passw0rd",
    "12345678",
    "123456789",
    "1234567890",
    "87654321",
    "11111111",
    "00000000",
    "88888888",
    "qwertyui",
    "qwerty123",
    "qwerty12",
    "1q2w3e4r",
    "1qaz2wsx",
    "zaq12wsx",
    "abc12345",
    "abcd1234",
    "iloveyou",
    "sunshine",
    "football",
    "baseball",
    "welcome1",
    "welcome123",
    "trustno1",
    "superman",
    "princess",
    "letmein1",
    "admin123",
    "administrator",
    "changeme",
    "starwars",
    "whatever",
    "computer",
    "michael1",
    "corvette",
    "mercedes",
    "asdfghjk",
];

pub fn hash_password(password: &str) -> Result<String, AuthError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(AuthError::PasswordTooShort {
            min: MIN_PASSWORD_LEN,
        });
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AuthError::PasswordTooLong {
            max: MAX_PASSWORD_BYTES,
        });
    }
    if COMMON_PASSWORDS.contains(&password.to_lowercase().as_str()) {
        return Err(AuthError::CommonPassword);
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
    fn common_and_overlong_passwords_are_refused() {
        assert!(matches!(
            hash_password("Password123"),
            Err(AuthError::CommonPassword)
        ));
        assert!(matches!(
            hash_password(&"x".repeat(MAX_PASSWORD_BYTES + 1)),
            Err(AuthError::PasswordTooLong { .. })
        ));
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

/// The longest username and password a sign-in accepts: anything longer is
/// refused before it is hashed, looked up or counted.
pub const MAX_USERNAME_BYTES: usize = 64;
pub const MAX_PASSWORD_BYTES: usize = 256;

/// Slows guessing without letting anyone lock anyone else out, and bounds
/// what sign-ins can cost the server.
///
/// - Each (account, address) pair may try `burst` times at once, then once
///   per `refill`: a guesser's waits grow with every attempt, while the
///   same account from another address (its owner) is unaffected.
/// - Each address may try `address_burst` times at once, then once per
///   `refill / 10`, whatever the account (credential stuffing).
/// - An attempt counts when it is checked, before the password is, so
///   concurrent attempts cannot all pass the check (it is refunded by
///   nothing: a success costs one attempt too).
/// - Keys are SHA-256 digests (fixed size, whatever the name) and the
///   limiter forgets keys whose allowance has fully refilled, so memory is
///   bounded by recent attempts, not by every name ever tried.
/// - At most `verifiers` password checks run at once (Argon2 takes about
///   19 MiB and a core's worth of time each); an attempt that finds them
///   all busy is told to retry and is not counted.
pub struct SignInThrottle {
    pairs: governor::DefaultKeyedRateLimiter<[u8; 32]>,
    addresses: governor::DefaultKeyedRateLimiter<[u8; 32]>,
    verifiers: std::sync::Arc<tokio::sync::Semaphore>,
    clock: governor::clock::DefaultClock,
    checks: std::sync::atomic::AtomicU64,
}

/// Why a sign-in attempt is not checked now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotNow {
    /// Too many attempts: wait this long.
    Throttled(std::time::Duration),
    /// Every password checker is busy: retry in a moment.
    Busy,
}

impl SignInThrottle {
    /// Five attempts per account and address, then one a minute; sixty per
    /// address, then one every six seconds; as many checks at once as the
    /// machine has cores.
    pub fn standard() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        SignInThrottle::new(5, 60, std::time::Duration::from_secs(60), cores)
    }

    pub fn new(
        burst: u32,
        address_burst: u32,
        refill: std::time::Duration,
        verifiers: usize,
    ) -> Self {
        use governor::{Quota, RateLimiter};
        use std::num::NonZeroU32;
        let nonzero = |n: u32| NonZeroU32::new(n.max(1)).unwrap_or(NonZeroU32::MIN);
        let pair_quota = Quota::with_period(refill)
            .unwrap_or_else(|| Quota::per_minute(nonzero(1)))
            .allow_burst(nonzero(burst));
        let address_quota = Quota::with_period(refill / 10)
            .unwrap_or_else(|| Quota::per_second(nonzero(1)))
            .allow_burst(nonzero(address_burst));
        SignInThrottle {
            pairs: RateLimiter::keyed(pair_quota),
            addresses: RateLimiter::keyed(address_quota),
            verifiers: std::sync::Arc::new(tokio::sync::Semaphore::new(verifiers.max(1))),
            clock: governor::clock::DefaultClock::default(),
            checks: Default::default(),
        }
    }

    /// Counts one attempt for this account from this address and, if it is
    /// allowed, hands out one of the password checkers; keep it while the
    /// password is verified.
    pub fn attempt(
        &self,
        account: &str,
        address: Option<std::net::IpAddr>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, NotNow> {
        use governor::clock::Clock;
        // A checker first: an attempt turned away because the server is
        // busy is not counted against anyone.
        let checker = self
            .verifiers
            .clone()
            .try_acquire_owned()
            .map_err(|_| NotNow::Busy)?;
        self.forget_refilled();
        let address = address.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
        let pair = digest(&format!("{}\n{address}", account.to_lowercase()));
        let from = digest(&address);
        let now = self.clock.now();
        let wait = [self.pairs.check_key(&pair), self.addresses.check_key(&from)]
            .into_iter()
            .filter_map(Result::err)
            .map(|not_until| not_until.wait_time_from(now))
            .max();
        match wait {
            Some(wait) => Err(NotNow::Throttled(wait)),
            None => Ok(checker),
        }
    }

    /// Keys tracked now (for tests and metrics).
    pub fn tracked(&self) -> usize {
        self.pairs.len() + self.addresses.len()
    }

    /// Every thousandth check, drops keys whose allowance has refilled.
    fn forget_refilled(&self) {
        use std::sync::atomic::Ordering;
        if self.checks.fetch_add(1, Ordering::Relaxed) % 1000 == 999 {
            self.pairs.retain_recent();
            self.addresses.retain_recent();
            self.pairs.shrink_to_fit();
            self.addresses.shrink_to_fit();
        }
    }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

#[cfg(test)]
mod throttle_tests {
    use super::{NotNow, SignInThrottle};
    use std::net::IpAddr;
    use std::time::Duration;

    fn ip(text: &str) -> Option<IpAddr> {
        text.parse().ok()
    }

    #[test]
    fn the_sixth_attempt_for_an_account_from_one_address_waits() {
        let throttle = SignInThrottle::new(5, 60, Duration::from_secs(60), 4);
        for _ in 0..5 {
            assert!(throttle.attempt("dana", ip("10.0.0.1")).is_ok());
        }
        let Err(NotNow::Throttled(wait)) = throttle.attempt("Dana", ip("10.0.0.1")) else {
            panic!("the sixth attempt must wait");
        };
        assert!(
            wait > Duration::from_secs(50) && wait <= Duration::from_secs(60),
            "{wait:?}"
        );
        // Neither the account from elsewhere nor another account from here
        // is locked out.
        assert!(throttle.attempt("dana", ip("10.0.0.2")).is_ok());
        assert!(throttle.attempt("lee", ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn one_address_trying_many_accounts_is_slowed_too() {
        let throttle = SignInThrottle::new(5, 10, Duration::from_secs(60), 4);
        for n in 0..10 {
            assert!(throttle
                .attempt(&format!("user{n}"), ip("10.0.0.9"))
                .is_ok());
        }
        assert!(matches!(
            throttle.attempt("user99", ip("10.0.0.9")),
            Err(NotNow::Throttled(_))
        ));
    }

    #[test]
    fn no_more_password_checks_run_at_once_than_there_are_checkers() {
        let throttle = SignInThrottle::new(100, 100, Duration::from_secs(60), 2);
        let a = throttle.attempt("a", ip("10.0.0.1")).unwrap();
        let _b = throttle.attempt("b", ip("10.0.0.1")).unwrap();
        assert_eq!(
            throttle.attempt("c", ip("10.0.0.1")).unwrap_err(),
            NotNow::Busy
        );
        drop(a);
        assert!(throttle.attempt("c", ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn keys_are_fixed_size_and_forgotten_once_refilled() {
        let throttle = SignInThrottle::new(5, 60, Duration::from_millis(10), 4);
        let huge = "x".repeat(1 << 20);
        let _ = throttle.attempt(&huge, ip("10.0.0.1"));
        for n in 0..2000 {
            let _ = throttle.attempt(&format!("name{n}"), ip("10.0.0.1"));
        }
        std::thread::sleep(Duration::from_millis(700));
        for _ in 0..1000 {
            let _ = throttle.attempt("again", ip("10.0.0.3"));
        }
        assert!(throttle.tracked() < 100, "{} keys kept", throttle.tracked());
    }
}
