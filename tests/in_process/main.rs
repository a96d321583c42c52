//! The tests that run the harness inside the test process: the engine
//! against the model world, the store contract on both backends, each
//! connector against its simulator, and the server over real HTTP on
//! port 0. One binary, so that it is linked once.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod approvers;
mod connector_http;
mod connector_jira;
mod connector_slack;
mod connector_smtp;
mod connector_stripe;
mod connector_zendesk;
mod engine;
mod engine_properties;
mod incident;
mod limits;
mod retention;
mod server;
mod sign_in;
mod store_contract;
