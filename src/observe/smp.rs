//! SMP observer over umad. Placeholder until the wire layer lands.
