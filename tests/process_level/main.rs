//! The tests that run the real `saga-harness` binary as its own process
//! (or several): crashes and freezes, racing instances, the database and
//! the pooler stopped under load, what an attacker tries, the MCP gateway
//! with real clients, the demo and the benchmark as a newcomer runs them.
//! One binary, so that it is linked once.

#[path = "../common/mod.rs"]
mod common;

mod authorisation;
mod bad_input;
mod bench;
mod crash_kill;
mod demo;
mod eval;
mod load;
mod mcp;
mod operations;
mod retention;
mod security;
mod slack_approvals;
mod two_processes;
