//! The process's log: human-readable lines by default, or one JSON object
//! a line (`--log-format json`) with the spans each line happened in (the
//! request, the saga step, the system request), for a log pipeline. With
//! `--otlp-endpoint`, the same spans also go to an OpenTelemetry collector
//! over OTLP/HTTP, so a call's trace runs from the API request to the
//! system's answer.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

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
#[cfg(feature = "bench")]
pub const BENCH_FILTER: &str = "warn,sqlx=error";

/// The OTLP export, kept until the process ends so the spans still queued
/// are sent.
pub struct Export(SdkTracerProvider);

impl Export {
    /// Sends what is queued and stops the exporter.
    pub fn finish(self) {
        if let Err(err) = self.0.shutdown() {
            eprintln!("the last spans could not be exported: {err}");
        }
    }
}

/// Installs the process-wide subscriber. `quiet` is the filter used when
/// `RUST_LOG` names none; with `otlp`, spans are exported there too.
pub fn init(
    format: LogFormat,
    quiet: &str,
    otlp: Option<&url::Url>,
) -> Result<Option<Export>, String> {
    // The same filter for both: the exporter's own HTTP client would
    // otherwise trace its own exports.
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| quiet.into());
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        LogFormat::Json => lines
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .flatten_event(true)
            .boxed(),
    };
    let (export, traces) = match otlp {
        Some(endpoint) => {
            let provider = exporter(endpoint)?;
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("saga-harness"))
                .with_filter(filter())
                .boxed();
            (Some(Export(provider)), Some(layer))
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(lines.with_filter(filter()))
        .with(traces)
        .init();
    Ok(export)
}

/// Batches spans and posts them, as protobuf, to `{endpoint}/v1/traces`.
fn exporter(endpoint: &url::Url) -> Result<SdkTracerProvider, String> {
    // The exporter's client uses the crypto the connectors' TLS already uses.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let traces = endpoint
        .join("v1/traces")
        .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(traces.as_str())
        .build()
        .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("saga-harness")
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}
