//! The `saga-harness` binary: serve, migrate, add users, issue tokens.

#[cfg(feature = "ssr")]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    saga_harness::cli::main().await
}

#[cfg(not(feature = "ssr"))]
fn main() {
    // The browser half is the library's `hydrate()`; this binary needs `ssr`.
}
