//! Command handling and the reconciler.
