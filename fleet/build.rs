//! Generates the gRPC clients (and, for tests and the bench's fake agents, servers) of the
//! contract in `../proto`, with `protox` (no system `protoc`).

const PROTOS: &[&str] = &[
    "../proto/fabric/agent/v1/agent.proto",
    "../proto/fabric/sm/v1/partitions.proto",
    "../proto/fabric/grant/v1/grant.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(PROTOS, ["../proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=../proto");
    Ok(())
}
