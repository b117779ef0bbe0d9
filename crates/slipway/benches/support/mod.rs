//! What the end-to-end benches share: the release plugins they run, and the `slipway` command
//! in a bench's directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

/// Build `packages` (fleeting plugins) in release; the directory holding them beside the
/// `slipway` binary under bench.
pub fn build_plugins(repo: &Path, packages: &[&str]) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec!["build", "--release"];
    for p in packages {
        args.extend(["-p", p]);
    }
    let st = Command::new(cargo).args(&args).current_dir(repo).status()?;
    if !st.success() {
        bail!(
            "building the fleeting plugins ({}) failed",
            packages.join(", ")
        );
    }
    let slipway = PathBuf::from(env!("CARGO_BIN_EXE_slipway"));
    let dir = slipway.parent().context("the binaries' directory")?;
    if !dir.join("fleeting-plugin-local").exists() {
        bail!("no fleeting-plugin-local in {}", dir.display());
    }
    Ok(dir.to_path_buf())
}

/// `slipway ARGS` in `dir`, with its TMPDIR and the plugins of `plugins`.
pub fn slipway(dir: &Path, plugins: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_slipway"));
    c.args(args)
        .current_dir(dir)
        .env("TMPDIR", dir.join("tmp"))
        .env("SLIPWAY_PLUGIN_DIR", plugins)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    c
}
