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

pub use crate::saga::model::TOKEN_NOT_VALID;

/// Tokens this instance has looked up and found valid: their agents, by
/// hash. A token's agent never changes, but the token may be revoked at
/// any time by any process, so a remembered token is never trusted on its
/// own: the step's intent checks it in the same statement, and every other
/// path looks it up (`Engine::call_from`). Bounded: past `KNOWN_TOKENS`
/// the token used least recently is forgotten (and looked up again when it
/// comes back), never a token in use.
pub struct KnownTokens(std::sync::Mutex<lru::LruCache<String, String>>);

const KNOWN_TOKENS: std::num::NonZeroUsize = std::num::NonZeroUsize::new(10_000).unwrap();

impl Default for KnownTokens {
    fn default() -> Self {
        KnownTokens(std::sync::Mutex::new(lru::LruCache::new(KNOWN_TOKENS)))
    }
}

impl KnownTokens {
    /// The agent a token was issued to, if this instance has seen it valid.
    pub fn agent(&self, hash: &str) -> Option<String> {
        self.0.lock().ok()?.get(hash).cloned()
    }

    pub fn remember(&self, hash: String, agent: String) {
        if let Ok(mut known) = self.0.lock() {
            known.put(hash, agent);
        }
    }
}

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
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
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
    hex::encode(Sha256::digest(token.as_bytes()))
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
/// - A client is an IPv4 address or an IPv6 /64 (one subscriber's
///   network: an IPv6 client can change the rest of its address at will).
/// - Each client may try `address_burst` times at once, then one every six
///   seconds, whatever the account (credential stuffing). This cheap check
///   comes first, and a request it refuses is not stored anywhere, so a
///   flood from one client costs it its own allowance and nothing more.
/// - Each (account, client) pair has `free` attempts; after that, each
///   further failure doubles the wait before the next attempt (`first_wait`,
///   then twice that, up to `longest_wait`). The same account from another
///   client (its owner) and other accounts from this client are
///   unaffected. A success clears the pair.
/// - An attempt counts when it is checked, before the password is, and
///   stays counted as a failure unless it succeeds, so a burst of
///   concurrent guesses cannot all pass the check.
/// - Memory is bounded twice, and neither bound shuts out anyone else: a
///   client keeps at most `MAX_ACCOUNTS_PER_CLIENT` pairs whose wait is not
///   over (past that, only that client's new pairs wait), and at most
///   `MAX_CLIENTS` clients are remembered (past that, the one that tried
///   least recently is forgotten to make room). Account names are kept as
///   SHA-256 digests, fixed in size whatever the name.
/// - At most `verifiers` password checks run at once (Argon2 takes about
///   19 MiB and a core's worth of time each); an attempt that finds them
///   all busy is told to retry and is not counted.
pub struct SignInThrottle {
    free: u32,
    first_wait: std::time::Duration,
    longest_wait: std::time::Duration,
    pairs: std::sync::Arc<std::sync::Mutex<Pairs>>,
    clients: governor::DefaultKeyedRateLimiter<Client>,
    verifiers: std::sync::Arc<tokio::sync::Semaphore>,
    clock: governor::clock::DefaultClock,
}

/// The most clients whose sign-in attempts are remembered at once.
pub const MAX_CLIENTS: usize = 20_000;
/// The most accounts one client may be waiting on at once.
pub const MAX_ACCOUNTS_PER_CLIENT: usize = 64;

/// Who is signing in, as far as throttling can tell: an IPv4 address, the
/// /64 network of an IPv6 address, or nobody known (no peer address).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Client {
    V4([u8; 4]),
    V6Network([u8; 8]),
    Unknown,
}

impl Client {
    pub fn of(address: Option<std::net::IpAddr>) -> Client {
        match address.map(|ip| ip.to_canonical()) {
            Some(std::net::IpAddr::V4(v4)) => Client::V4(v4.octets()),
            Some(std::net::IpAddr::V6(v6)) => {
                let mut network = [0; 8];
                network.copy_from_slice(&v6.octets()[..8]);
                Client::V6Network(network)
            }
            None => Client::Unknown,
        }
    }
}

/// Failures per account, per client; both levels in least-recently-tried
/// order, so the oldest is always the one to forget.
struct Pairs {
    clients: lru::LruCache<Client, lru::LruCache<[u8; 32], PairCount>>,
}

impl Default for Pairs {
    fn default() -> Self {
        let cap = std::num::NonZeroUsize::new(MAX_CLIENTS).unwrap_or(std::num::NonZeroUsize::MIN);
        Pairs {
            clients: lru::LruCache::new(cap),
        }
    }
}

struct PairCount {
    /// Failures, counting attempts still being checked.
    failures: u32,
    last: std::time::Instant,
}

/// Why a sign-in attempt is not checked now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotNow {
    /// Too many attempts: wait this long.
    Throttled(std::time::Duration),
    /// Every password checker is busy: retry in a moment.
    Busy,
}

/// One counted attempt, holding a password checker until [`Attempt::checked`].
/// Dropped without [`Attempt::succeeded`], it stays counted as a failure.
pub struct Attempt {
    client: Client,
    account: [u8; 32],
    pairs: std::sync::Arc<std::sync::Mutex<Pairs>>,
    checker: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Attempt {
    /// The password has been checked: the checker is free for the next.
    pub fn checked(mut self) -> Attempt {
        self.checker = None;
        self
    }

    /// The password was right: the pair starts afresh.
    pub fn succeeded(self) {
        let mut pairs = lock(&self.pairs);
        if let Some(accounts) = pairs.clients.peek_mut(&self.client) {
            accounts.pop(&self.account);
        }
    }
}

fn lock(pairs: &std::sync::Mutex<Pairs>) -> std::sync::MutexGuard<'_, Pairs> {
    // A poisoned map only means a panic elsewhere; its counts still hold.
    pairs.lock().unwrap_or_else(|p| p.into_inner())
}

impl SignInThrottle {
    /// Five attempts per account and client, then waits of 1, 2, 4 …
    /// minutes up to fifteen; sixty per client at once, then one every six
    /// seconds; as many password checks at once as the machine has cores.
    pub fn standard() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        SignInThrottle::new(
            5,
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(15 * 60),
            60,
            cores,
        )
    }

    pub fn new(
        free: u32,
        first_wait: std::time::Duration,
        longest_wait: std::time::Duration,
        address_burst: u32,
        verifiers: usize,
    ) -> Self {
        use governor::{Quota, RateLimiter};
        use std::num::NonZeroU32;
        let burst = NonZeroU32::new(address_burst.max(1)).unwrap_or(NonZeroU32::MIN);
        let client_quota = Quota::with_period(std::time::Duration::from_secs(6))
            .unwrap_or_else(|| Quota::per_minute(NonZeroU32::MIN))
            .allow_burst(burst);
        SignInThrottle {
            free,
            first_wait,
            longest_wait: longest_wait.max(first_wait),
            pairs: Default::default(),
            clients: RateLimiter::keyed(client_quota),
            verifiers: std::sync::Arc::new(tokio::sync::Semaphore::new(verifiers.max(1))),
            clock: governor::clock::DefaultClock::default(),
        }
    }

    /// Counts one attempt for this account from this address and, if it is
    /// allowed, hands out one of the password checkers with it.
    pub fn attempt(
        &self,
        account: &str,
        address: Option<std::net::IpAddr>,
    ) -> Result<Attempt, NotNow> {
        use governor::clock::Clock;
        // A checker first: an attempt turned away because the server is
        // busy is not counted against anyone.
        let checker = self
            .verifiers
            .clone()
            .try_acquire_owned()
            .map_err(|_| NotNow::Busy)?;
        let client = Client::of(address);
        // The client's own allowance next; refused here, nothing is kept.
        if let Err(not_until) = self.clients.check_key(&client) {
            return Err(NotNow::Throttled(
                not_until.wait_time_from(self.clock.now()),
            ));
        }
        let account = digest(&account.to_lowercase());
        let now = std::time::Instant::now();
        let mut pairs = lock(&self.pairs);
        let accounts = pairs
            .clients
            .get_or_insert_mut(client, lru::LruCache::unbounded);
        if let Some(count) = accounts.get(&account) {
            if let Some(wait) = self.wait_after(count.failures) {
                let waited = now.duration_since(count.last);
                if waited < wait {
                    return Err(NotNow::Throttled(wait - waited));
                }
            }
        } else if accounts.len() >= MAX_ACCOUNTS_PER_CLIENT {
            // This client's oldest pair makes room once its wait is over;
            // until then only this client's new pairs wait.
            if let Some((_, oldest)) = accounts.peek_lru() {
                let since = now.duration_since(oldest.last);
                if since < self.longest_wait {
                    return Err(NotNow::Throttled(self.longest_wait - since));
                }
            }
            accounts.pop_lru();
        }
        let count = accounts.get_or_insert_mut(account, || PairCount {
            failures: 0,
            last: now,
        });
        count.failures += 1;
        count.last = now;
        drop(pairs);
        Ok(Attempt {
            client,
            account,
            pairs: self.pairs.clone(),
            checker: Some(checker),
        })
    }

    /// How long a pair with this many failures waits before its next
    /// attempt: nothing for the free ones, then doubling.
    fn wait_after(&self, failures: u32) -> Option<std::time::Duration> {
        let over = failures.checked_sub(self.free)?;
        let doubled = self.first_wait.saturating_mul(1u32 << over.min(16));
        Some(doubled.min(self.longest_wait))
    }

    /// Pairs and clients tracked now (for tests and metrics).
    pub fn tracked(&self) -> usize {
        let pairs: usize = lock(&self.pairs)
            .clients
            .iter()
            .map(|(_, accounts)| accounts.len())
            .sum();
        pairs + self.clients.len()
    }

    /// Forgets pairs whose longest wait is over and clients whose
    /// allowance has refilled; the server calls it now and then.
    pub fn forget_old(&self) {
        let now = std::time::Instant::now();
        let longest = self.longest_wait;
        let mut pairs = lock(&self.pairs);
        let mut emptied = Vec::new();
        for (client, accounts) in pairs.clients.iter_mut() {
            // Least recently tried first, so the first recent one ends it.
            while accounts
                .peek_lru()
                .is_some_and(|(_, count)| now.duration_since(count.last) >= longest)
            {
                accounts.pop_lru();
            }
            if accounts.is_empty() {
                emptied.push(*client);
            }
        }
        for client in emptied {
            pairs.clients.pop(&client);
        }
        drop(pairs);
        self.clients.retain_recent();
        self.clients.shrink_to_fit();
    }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

#[cfg(test)]
mod throttle_tests {
    use super::{
        KnownTokens, NotNow, SignInThrottle, KNOWN_TOKENS, MAX_ACCOUNTS_PER_CLIENT, MAX_CLIENTS,
    };
    use std::net::IpAddr;
    use std::time::Duration;

    fn ip(text: &str) -> Option<IpAddr> {
        text.parse().ok()
    }

    fn throttle() -> SignInThrottle {
        SignInThrottle::new(5, Duration::from_secs(60), Duration::from_secs(900), 60, 4)
    }

    #[test]
    fn after_five_failures_an_account_waits_at_that_address_only() {
        let throttle = throttle();
        for _ in 0..5 {
            drop(throttle.attempt("dana", ip("10.0.0.1")).unwrap());
        }
        let Err(NotNow::Throttled(wait)) = throttle.attempt("Dana", ip("10.0.0.1")) else {
            panic!("the sixth attempt must wait");
        };
        assert!(
            wait > Duration::from_secs(55) && wait <= Duration::from_secs(60),
            "{wait:?}"
        );
        // Neither the account from elsewhere nor another account from here
        // is locked out.
        assert!(throttle.attempt("dana", ip("10.0.0.2")).is_ok());
        assert!(throttle.attempt("lee", ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn waits_grow_with_each_failure_and_a_success_clears_them() {
        let throttle = SignInThrottle::new(
            1,
            Duration::from_millis(40),
            Duration::from_secs(900),
            60,
            4,
        );
        drop(throttle.attempt("dana", ip("10.0.0.1")).unwrap());
        assert!(matches!(
            throttle.attempt("dana", ip("10.0.0.1")),
            Err(NotNow::Throttled(_))
        ));
        std::thread::sleep(Duration::from_millis(45));
        drop(throttle.attempt("dana", ip("10.0.0.1")).unwrap());
        std::thread::sleep(Duration::from_millis(45));
        let Err(NotNow::Throttled(wait)) = throttle.attempt("dana", ip("10.0.0.1")) else {
            panic!("the second wait is longer than the first");
        };
        assert!(wait > Duration::from_millis(20), "{wait:?}");
        std::thread::sleep(wait + Duration::from_millis(5));
        throttle
            .attempt("dana", ip("10.0.0.1"))
            .unwrap()
            .succeeded();
        assert!(
            throttle.attempt("dana", ip("10.0.0.1")).is_ok(),
            "a success starts afresh"
        );
    }

    #[test]
    fn concurrent_attempts_count_before_they_are_checked() {
        let throttle = SignInThrottle::new(
            5,
            Duration::from_secs(60),
            Duration::from_secs(900),
            60,
            100,
        );
        let held: Vec<_> = (0..5)
            .map(|_| throttle.attempt("dana", ip("10.0.0.1")).unwrap())
            .collect();
        assert!(matches!(
            throttle.attempt("dana", ip("10.0.0.1")),
            Err(NotNow::Throttled(_))
        ));
        drop(held);
    }

    #[test]
    fn one_address_trying_many_accounts_is_slowed_too() {
        let throttle =
            SignInThrottle::new(5, Duration::from_secs(60), Duration::from_secs(900), 10, 4);
        for n in 0..10 {
            drop(
                throttle
                    .attempt(&format!("user{n}"), ip("10.0.0.9"))
                    .unwrap(),
            );
        }
        assert!(matches!(
            throttle.attempt("user99", ip("10.0.0.9")),
            Err(NotNow::Throttled(_))
        ));
    }

    #[test]
    fn no_more_password_checks_run_at_once_than_there_are_checkers() {
        let throttle = SignInThrottle::new(
            100,
            Duration::from_secs(60),
            Duration::from_secs(900),
            100,
            2,
        );
        let a = throttle.attempt("a", ip("10.0.0.1")).unwrap();
        let _b = throttle.attempt("b", ip("10.0.0.1")).unwrap();
        assert_eq!(
            throttle.attempt("c", ip("10.0.0.1")).err(),
            Some(NotNow::Busy)
        );
        drop(a);
        assert!(throttle.attempt("c", ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn keys_are_fixed_size_and_forgotten_once_their_wait_is_over() {
        let throttle = SignInThrottle::new(
            5,
            Duration::from_millis(10),
            Duration::from_millis(20),
            5000,
            4,
        );
        let huge = "x".repeat(1 << 20);
        drop(throttle.attempt(&huge, ip("10.0.0.1")));
        for n in 0..2000u32 {
            let [_, _, high, low] = n.to_be_bytes();
            drop(throttle.attempt(&format!("name{n}"), ip(&format!("10.1.{high}.{low}"))));
        }
        assert!(pairs(&throttle) >= 2000);
        std::thread::sleep(Duration::from_millis(50));
        throttle.forget_old();
        assert_eq!(pairs(&throttle), 0, "pairs kept past their wait");
    }

    /// (account, client) pairs remembered now.
    fn pairs(throttle: &SignInThrottle) -> usize {
        super::lock(&throttle.pairs)
            .clients
            .iter()
            .map(|(_, accounts)| accounts.len())
            .sum()
    }

    /// The review's flood: 100,000 sign-ins with made-up names from one
    /// address in a burst. The right password from anywhere else still
    /// gets its check, and the flood kept almost nothing.
    #[test]
    fn a_flood_of_made_up_names_from_one_address_locks_out_nobody_else() {
        let throttle = SignInThrottle::standard();
        let mut refused = 0;
        for n in 0..100_000 {
            if throttle
                .attempt(&format!("nobody{n}"), ip("203.0.113.9"))
                .is_err()
            {
                refused += 1;
            }
        }
        assert!(refused > 99_000, "only {refused} of the flood were refused");
        println!(
            "flood of 100,000: {refused} refused, {} entries kept",
            throttle.tracked()
        );
        assert!(
            throttle.tracked() <= MAX_ACCOUNTS_PER_CLIENT + 1,
            "the flood left {} entries",
            throttle.tracked()
        );
        let dana = throttle.attempt("dana", ip("198.51.100.4"));
        assert!(dana.is_ok(), "dana from her own address: {:?}", dana.err());
        let lee = throttle.attempt("lee", ip("2001:db8:1::7"));
        assert!(lee.is_ok(), "lee over IPv6: {:?}", lee.err());
    }

    #[test]
    fn when_every_client_slot_is_taken_the_least_recent_client_makes_room() {
        let throttle = throttle();
        for n in 0..(MAX_CLIENTS as u32 + 500) {
            let [_, a, b, c] = n.to_be_bytes();
            drop(throttle.attempt("dana", ip(&format!("10.{a}.{b}.{c}"))));
        }
        assert_eq!(pairs(&throttle), MAX_CLIENTS, "memory stays bounded");
        assert!(
            throttle.attempt("dana", ip("192.0.2.200")).is_ok(),
            "a newcomer is never refused for want of room"
        );
    }

    #[test]
    fn a_full_token_memory_forgets_the_token_least_recently_used_not_one_in_use() {
        let known = KnownTokens::default();
        known.remember("busy".into(), "support-bot".into());
        known.remember("idle".into(), "billing-bot".into());
        for n in 0..KNOWN_TOKENS.get() - 1 {
            if n % 100 == 0 {
                assert!(known.agent("busy").is_some(), "forgot a token in use");
            }
            known.remember(format!("other-{n}"), "another-bot".into());
        }
        assert_eq!(known.agent("busy").as_deref(), Some("support-bot"));
        // Forgotten, not refused: the next request with it is looked up.
        assert_eq!(known.agent("idle"), None);
    }

    #[test]
    fn a_client_waiting_on_too_many_accounts_waits_alone() {
        let throttle = SignInThrottle::new(
            5,
            Duration::from_secs(60),
            Duration::from_secs(900),
            10_000,
            4,
        );
        for n in 0..MAX_ACCOUNTS_PER_CLIENT {
            drop(
                throttle
                    .attempt(&format!("user{n}"), ip("10.0.0.9"))
                    .unwrap(),
            );
        }
        assert!(matches!(
            throttle.attempt("one-more", ip("10.0.0.9")),
            Err(NotNow::Throttled(_))
        ));
        // The accounts it already tried go on being counted, and every
        // other client is untouched.
        assert!(throttle.attempt("user0", ip("10.0.0.9")).is_ok());
        assert!(throttle.attempt("one-more", ip("10.0.0.10")).is_ok());
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64_network() {
        let throttle =
            SignInThrottle::new(5, Duration::from_secs(60), Duration::from_secs(900), 10, 4);
        // Ten names, each from another address of one /64.
        for n in 1..=10 {
            drop(
                throttle
                    .attempt(&format!("user{n}"), ip(&format!("2001:db8:0:1::{n:x}")))
                    .unwrap(),
            );
        }
        assert!(
            matches!(
                throttle.attempt("user99", ip("2001:db8:0:1:ffff::1")),
                Err(NotNow::Throttled(_))
            ),
            "a new address in the same /64 is the same client"
        );
        assert!(throttle.attempt("user99", ip("2001:db8:0:2::1")).is_ok());
        // An IPv4 client reached over IPv6 is still that IPv4 client.
        assert_eq!(
            super::Client::of(ip("::ffff:192.0.2.1")),
            super::Client::of(ip("192.0.2.1"))
        );
    }
}
