//! gRPC services.
