//! Compiles the nesting v1 contract with protox (no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time: a build-script binary reused from another checkout (a shared target
    // dir) must still find this checkout's files.
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let file = root.join("nesting/v1/nesting.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
