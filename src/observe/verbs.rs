//! libibverbs observer. Placeholder until it lands.
