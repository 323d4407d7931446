//! Generates the fmsched.v1 tonic code and the file descriptor set served by
//! gRPC reflection. Uses `protoc` from PATH/`PROTOC` when present, else the
//! vendored binary, so a fresh machine needs no system package.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos: Vec<PathBuf> = [
        "fmsched/v1/jobs.proto",
        "fmsched/v1/cluster.proto",
        "fmsched/v1/agent.proto",
        "fmsched/v1/estimator.proto",
        "fmsched/v1/admin.proto",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    let mut includes = vec![PathBuf::from(".")];
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc) };
        includes.push(protoc_bin_vendored::include_path()?);
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Decode errors are the caller's: INVALID_ARGUMENT (src/codec.rs).
        .codec_path("crate::codec::FieldCodec")
        .file_descriptor_set_path(out_dir.join("fmsched_v1_descriptor.bin"))
        .compile_protos(&protos, &includes)?;
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    Ok(())
}
