//! Compiles `proto/` with protox (pure Rust), so no `protoc` is needed.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "weft/cnirpc/v1/cni.proto",
        "weft/admin/v1/admin.proto",
        "weft/wire/v1/wire.proto",
        "google/rpc/status.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        // Frame payloads are reference-counted slices: no copy per frame on decode.
        .bytes(".weft.wire.v1.Frame.data")
        .compile_fds(fds)?;
    Ok(())
}
