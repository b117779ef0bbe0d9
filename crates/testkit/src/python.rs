//! Python plugins (the go-plugin peer, PyPI `python-plugin`): an interpreter that has it, and
//! grpclib stubs generated from `proto/` (never committed).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{FixtureError, err};

const IMPORT_CHECK: &str = "import pyplugin, grpclib, grpc_tools.protoc";

fn python_ok(python: &str) -> bool {
    Command::new(python)
        .args(["-c", IMPORT_CHECK])
        .status()
        .is_ok_and(|s| s.success())
}

/// The real interpreter (not a pyenv shim) with python-plugin and grpcio-tools importable,
/// installing them with pip when missing (`$PYTHON`, default `python3`).
pub fn python() -> Result<PathBuf, FixtureError> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    if !python_ok(&python) {
        for extra in [&[][..], &["--break-system-packages"][..]] {
            let _ = Command::new(&python)
                .args(["-m", "pip", "install", "--quiet"])
                .args(extra)
                .args(["python-plugin", "grpcio-tools"])
                .status();
            if python_ok(&python) {
                break;
            }
        }
        if !python_ok(&python) {
            return Err(err(
                "python plugin peer",
                format!(
                    "{python} cannot import python-plugin (pyplugin), grpclib and grpcio-tools, \
                     and `{python} -m pip install python-plugin grpcio-tools` did not fix it"
                ),
            ));
        }
    }
    let out = Command::new(&python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .map_err(|e| err("running python", e))?;
    Ok(PathBuf::from(
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    ))
}

/// The repository's `proto/` directory.
pub fn proto_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto")
}

/// Generate grpclib stubs for `proto` (relative to `proto/`, e.g. `executor/v1/executor.proto`)
/// into `out`.
pub fn generate_stubs(python: &Path, proto: &str, out: &Path) -> Result<(), FixtureError> {
    std::fs::create_dir_all(out).map_err(|e| err("creating the stubs directory", e))?;
    // Name the grpclib protoc plugin explicitly: it sits next to the interpreter, maybe not on PATH.
    let protoc_plugin = python.with_file_name("protoc-gen-grpclib_python");
    let mut cmd = Command::new(python);
    cmd.args(["-m", "grpc_tools.protoc"])
        .arg("-I")
        .arg(proto_root());
    if protoc_plugin.exists() {
        cmd.arg(format!(
            "--plugin=protoc-gen-grpclib_python={}",
            protoc_plugin.display()
        ));
    }
    let output = cmd
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpclib_python_out={}", out.display()))
        .arg(proto)
        .output()
        .map_err(|e| err("running grpc_tools.protoc", e))?;
    if !output.status.success() {
        return Err(err(
            "grpc_tools.protoc",
            String::from_utf8_lossy(&output.stderr),
        ));
    }
    Ok(())
}

/// An executable `name` in `dir` that runs `script` (with `args`) under `python`, with `stubs`
/// on `PYTHONPATH`: how a plugin host starts a Python plugin.
pub fn wrapper(
    dir: &Path,
    name: &str,
    python: &Path,
    stubs: &Path,
    script: &Path,
    args: &[&str],
) -> Result<PathBuf, FixtureError> {
    let path = dir.join(name);
    let args: String = args.iter().map(|a| format!(" '{a}'")).collect();
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nPYTHONPATH='{}' PYTHONUNBUFFERED=1 exec '{}' '{}'{args}\n",
            stubs.display(),
            python.display(),
            script.display()
        ),
    )
    .map_err(|e| err("writing the plugin wrapper", e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| err("making the plugin wrapper executable", e))?;
    Ok(path)
}
