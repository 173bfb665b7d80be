//! Generates the gRPC code for the agent's two APIs.
//!
//! The protos are compiled by `protox`, a protobuf compiler written in Rust that carries the
//! well-known types (`google/protobuf/timestamp.proto`, ...) itself, so the build needs no
//! system `protoc` and no Debian protobuf package.
use prost::Message;

const PROTOS: &[&str] = &[
    "proto/fabric/agent/v1/agent.proto",
    "proto/fabric/sm/v1/partitions.proto",
    "proto/fabric/grant/v1/grant.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    // The same descriptors serve gRPC reflection at run time.
    std::fs::write(
        out.join("fabric_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
