//! Compiles `proto/` with protox (pure Rust), so no `protoc` is needed.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "weft/cnirpc/v1/cni.proto",
        "weft/admin/v1/admin.proto",
        "google/rpc/status.proto",
    ];
    let wire = "weft/wire/v1/wire.proto";
    for f in files.iter().chain([&wire]) {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    // The wire port's services on their own: the codec sizes buffers for batches of
    // frames. `Policy` shares the file (its requests carry the same `Hello`) and so the
    // codec; its calls are one per ADD and peer, where a 64 KiB buffer costs nothing
    // that matters.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .codec_path("crate::codec::WireCodec")
        // `Policy.Flows` answers with the admin service's messages, generated below.
        .extern_path(".weft.admin.v1", "crate::admin")
        // Frame payloads are reference-counted slices: no copy per frame on decode.
        .bytes(".weft.wire.v1.Frame.data")
        .compile_fds(protox::compile([wire], [&root])?)?;
    // After the wire port's: that run also writes the admin file it imports (its types
    // pointing at `crate::admin` through `extern_path`, which prost applies to the whole
    // descriptor set), and this one writes it again, whole.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .compile_fds(protox::compile(files, [&root])?)?;
    Ok(())
}
