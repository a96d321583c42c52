//! Saga Harness: a write-ahead saga log between LLM agents and the systems
//! their tools touch, with a Leptos dashboard for the people who approve
//! what agents do.
//!
//! The crate is built twice: with `ssr` into the server binary (everything
//! below), with `hydrate` into the wasm that makes the dashboard live.

// The dashboard's view types nest deeply; release builds (which do not
// erase them) need more than the default query depth to lay them out.
#![recursion_limit = "512"]

/// The saga core, a crate of its own so that it cannot reach up into HTTP,
/// HTML or SQL; under its old name so that every path reads as before.
pub use saga_core as saga;
pub mod ui;

#[cfg(feature = "ssr")]
pub mod api;
#[cfg(feature = "ssr")]
pub mod approvals;
#[cfg(feature = "ssr")]
pub mod auth;
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "ssr")]
pub mod cli;
#[cfg(feature = "ssr")]
pub mod config;
#[cfg(feature = "ssr")]
pub mod connectors;
#[cfg(feature = "simulators")]
pub mod demo;
#[cfg(feature = "simulators")]
pub mod eval;
#[cfg(feature = "ssr")]
pub use saga_core::failpoint;
#[cfg(feature = "ssr")]
pub mod incident;
#[cfg(feature = "ssr")]
pub mod mcp;
#[cfg(feature = "ssr")]
pub mod oidc;
#[cfg(feature = "ssr")]
pub mod ops;
#[cfg(feature = "ssr")]
pub mod server;
#[cfg(feature = "ssr")]
pub mod serving;
/// The simulated systems, only in a build that asks for them.
#[cfg(feature = "simulators")]
pub use saga_simulators as sim;
#[cfg(feature = "ssr")]
pub mod sign_in;
#[cfg(feature = "ssr")]
pub mod state;
#[cfg(feature = "ssr")]
pub mod store;
#[cfg(feature = "ssr")]
pub mod streams;

#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(ui::App);
}
