//! Where `cargo` puts the `fabric-agent` binary of this build: the tests start it as a process.
//! `OUT_DIR` is `<target>/<profile>/build/<crate>-<hash>/out`; the binary is `<target>/<profile>/fabric-agent`.

fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let profile_dir = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR is <target>/<profile>/build/<crate>/out");
    println!(
        "cargo:rustc-env=FABRIC_AGENT_BIN={}",
        profile_dir.join("fabric-agent").display()
    );
    println!("cargo:rerun-if-changed=build.rs");
}
