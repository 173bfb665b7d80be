//! MAD/SMP/SA codec: byte offsets, golden vectors; no unsafe, no I/O.
