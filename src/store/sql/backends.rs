//! `SagaStore` for each backend, from the one body written over `Dialect`
//! in `saga_store_over_dialect!` (the trait is the saga core's, so it is
//! implemented per store type).

use super::*;

saga_store_over_dialect!(crate::store::sqlite::SqliteStore);
saga_store_over_dialect!(crate::store::postgres::PostgresStore);
