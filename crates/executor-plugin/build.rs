//! Compiles the executor v1 contract with protox (no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not compile time: a build-script binary reused from another checkout
    // of the same sources (a shared target dir) must still find this checkout's files.
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [root.join("executor/v1/executor.proto")];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
