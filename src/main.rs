//! The `saga-harness` binary: serve, migrate, add users, issue tokens.

// The dashboard's view types nest deeply; release builds (which do not
// erase them) need more than the default query depth to lay them out.
#![recursion_limit = "512"]

#[cfg(feature = "ssr")]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    saga_harness::cli::main().await
}

#[cfg(not(feature = "ssr"))]
fn main() {
    // The browser half is the library's `hydrate()`; this binary needs `ssr`.
}
