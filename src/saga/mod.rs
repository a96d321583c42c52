//! The saga core: what a step is, how it may move, how its key is made and
//! what it needs from storage. Knows nothing of HTTP, HTML or SQL dialects;
//! storage, API, UI and connectors depend on it, never the reverse.

pub mod class;
pub mod input;
pub mod status;
pub mod words;

#[cfg(feature = "ssr")]
pub mod connector;
#[cfg(feature = "ssr")]
pub mod corrections;
#[cfg(feature = "ssr")]
pub mod described;
#[cfg(feature = "ssr")]
pub mod engine;
#[cfg(feature = "ssr")]
pub mod key;
#[cfg(feature = "ssr")]
pub mod model;
#[cfg(feature = "ssr")]
pub mod observe;
#[cfg(feature = "ssr")]
pub mod pivot;
#[cfg(feature = "ssr")]
pub mod questions;
#[cfg(feature = "ssr")]
pub mod registry;
#[cfg(feature = "ssr")]
pub mod resend;
#[cfg(feature = "ssr")]
pub mod resume;
#[cfg(feature = "ssr")]
pub mod store;
#[cfg(feature = "ssr")]
pub mod unwind;
