//! Durable store.
