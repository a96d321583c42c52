//! What the people who run the harness use to see it work: metrics on
//! their own listener, health and readiness checks, the log's format, and
//! `saga-harness doctor`, the last hour's figures for the operators'
//! page, and pruning settled history (`saga-harness prune`, `[retention]`).

pub mod doctor;
pub mod health;
pub mod history;
pub mod logging;
pub mod metrics;
pub mod retention;
