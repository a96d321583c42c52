//! The saga core: what a step is, how it may move, how its key is made and
//! what it needs from storage. Knows nothing of HTTP, HTML or SQL dialects;
//! storage, API, UI and connectors depend on it, never the reverse, and
//! being a crate of its own, it cannot import them.
//!
//! Without features it is the part the dashboard's wasm needs (classes,
//! statuses, the words steps are described in); the `engine` feature adds
//! the engine and everything it runs on.

#[cfg(feature = "engine")]
pub mod agent_acts;
#[cfg(feature = "engine")]
pub mod answer;
pub mod class;
pub mod input;
pub mod names;
pub mod status;
pub mod words;

#[cfg(feature = "engine")]
pub mod connector;
#[cfg(feature = "engine")]
pub mod corrections;
#[cfg(feature = "engine")]
mod decisions;
#[cfg(feature = "engine")]
pub mod described;
#[cfg(feature = "engine")]
pub mod engine;
#[cfg(feature = "engine")]
pub mod failpoint;
#[cfg(feature = "engine")]
pub mod key;
#[cfg(feature = "engine")]
pub mod limits;
#[cfg(feature = "engine")]
pub mod model;
#[cfg(feature = "engine")]
pub mod observe;
#[cfg(feature = "engine")]
pub mod pivot;
#[cfg(feature = "engine")]
pub mod questions;
#[cfg(feature = "engine")]
pub mod refusal;
#[cfg(feature = "engine")]
pub mod registry;
#[cfg(feature = "engine")]
pub mod resend;
#[cfg(feature = "engine")]
pub mod resume;
#[cfg(feature = "engine")]
pub mod retention;
#[cfg(feature = "engine")]
pub mod rights;
#[cfg(feature = "engine")]
mod run_locks;
#[cfg(feature = "engine")]
pub mod store;
#[cfg(feature = "engine")]
pub mod unwind;
