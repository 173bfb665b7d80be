//! Generates the gRPC code for the agent's two APIs.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("fabric_descriptor.bin"))
        .compile_protos(
            &[
                "proto/fabric/agent/v1/agent.proto",
                "proto/fabric/sm/v1/partitions.proto",
            ],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
