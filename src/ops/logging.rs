//! The process's log: human-readable lines by default, or one JSON object
//! a line (`--log-format json`) with the spans each line happened in (the
//! request, the saga step, the system request), for a log pipeline.

use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// What is logged when `RUST_LOG` names nothing. The session layer's own
/// span (`call`) would sit between a request and its saga step in every
/// trace, so it is left out.
pub const DEFAULT_FILTER: &str = "info,sqlx=warn,tower_sessions=warn,tower_sessions_core=warn";

/// The benchmark prints a table; its servers' and slow-query lines would
/// bury it.
pub const BENCH_FILTER: &str = "warn,sqlx=error";

/// Installs the process-wide subscriber. `quiet` is the filter used when
/// `RUST_LOG` names none.
pub fn init(format: LogFormat, quiet: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| quiet.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .flatten_event(true)
            .init(),
    }
}
