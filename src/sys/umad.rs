//! umad transport. Placeholder until the wire layer lands.
