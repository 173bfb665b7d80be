//! Stock clients: the real Python `grpcio` client from PyPI drives the agent over TCP and over
//! the unix socket through server reflection alone (`tests/grpcio/run.sh` and `client.py`):
//! list services, GetNode, AttachPartition -> ACTIVE, GetAttachment, ReleaseInstance ->
//! RELEASED. Over the socket it sets `grpc.default_authority`, the one option the README
//! documents. Skips when python3, venv or PyPI is unavailable, except under CI or
//! `scripts/test.sh`, where that is a failure.

use testkit::common::skip;

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

#[test]
fn python_grpcio_over_tcp_and_unix_socket() {
    // The venv is kept next to the build so that later runs skip the download.
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpcio-venv");
    let status = Command::new("bash")
        .arg("tests/grpcio/run.sh")
        .arg(BIN)
        .env("GRPCIO_VENV", &venv)
        .status()
        .expect("run bash tests/grpcio/run.sh");
    match status.code() {
        Some(0) => {}
        Some(77) => skip::skip("the grpcio test cannot run here (see its SKIP reason above)"),
        _ => panic!("tests/grpcio/run.sh failed: {status}"),
    }
}
