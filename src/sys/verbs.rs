//! libibverbs wrappers. Placeholder until they land.
