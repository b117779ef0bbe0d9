//! Google Cloud Storage and Azure Blob Storage on loopback ports, for the distributed cache's
//! tests: [`GcsEmulator`] (`gcp-storage-emulator`, from PyPI) and [`Azurite`] (Microsoft's
//! Azure Storage emulator, from npm; it checks every SAS signature). `scripts/deps.sh test`
//! installs both, and each `start` installs its own when it is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{FixtureError, err, kill_tree};

/// The pinned emulator releases: Azurite 3.34 is the newest that runs on Debian's Node 20.
pub const GCS_EMULATOR: &str = "gcp-storage-emulator==2026.7.19";
/// See [`GCS_EMULATOR`].
pub const AZURITE: &str = "azurite@3.34.0";

/// Azurite's well-known development account and key (published in Azure's documentation).
pub const AZURE_ACCOUNT: &str = "devstoreaccount1";
/// See [`AZURE_ACCOUNT`].
pub const AZURE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A child process killed with its children on drop, and the directory it works in.
#[derive(Debug)]
struct Server {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        kill_tree(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Run `program args` (the port appended by `with_port`), its output in `dir/server.log`,
    /// and wait until `ready` says it serves.
    fn start(
        what: &'static str,
        mut command: Command,
        ready: impl Fn(u16) -> bool,
    ) -> Result<Server, FixtureError> {
        let dir = tempfile::tempdir().map_err(|e| err(what, e))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| err("a free port", e))?
            .port();
        let log = std::fs::File::create(dir.path().join("server.log")).map_err(|e| err(what, e))?;
        command
            .arg(port.to_string())
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| err(what, e))?)
            .stderr(log);
        let child = command.spawn().map_err(|e| err(what, e))?;
        let server = Server { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready(port) {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(server.dir.path().join("server.log"))
                    .unwrap_or_default();
                return Err(err(what, format!("not ready within 60 s:\n{log}")));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(server)
    }
}

/// Run a Python program (after [`FETCH`]); its stdout.
fn python(what: &'static str, code: &str, args: &[&str]) -> Result<Vec<u8>, FixtureError> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!("{FETCH}\n{code}"))
        .args(args)
        .output()
        .map_err(|e| err(what, e))?;
    if !out.status.success() {
        return Err(err(what, String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(out.stdout)
}

/// Install with `install` unless `check` already succeeds; `what` names it in errors.
fn ensure(
    what: &'static str,
    check: &mut Command,
    install: &[&[&str]],
) -> Result<(), FixtureError> {
    let ok = |c: &mut Command| {
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ok(check) {
        return Ok(());
    }
    for argv in install {
        let _ = Command::new(argv[0]).args(&argv[1..]).status();
        if ok(check) {
            return Ok(());
        }
    }
    Err(err(
        what,
        format!(
            "not installed, and `{}` did not install it",
            install[0].join(" ")
        ),
    ))
}

/// Python's `fetch(req)`: the answer's body on stdout prefixed `1`, or `0` for a 404.
const FETCH: &str = r#"
import sys, urllib.error, urllib.request
def fetch(req):
    try:
        sys.stdout.buffer.write(b"1" + urllib.request.urlopen(req).read())
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
        sys.stdout.buffer.write(b"0")
"#;

/// Read an object through the emulator's JSON API (argv: URL, bucket, name): its bytes on
/// stdout, prefixed `1`, or `0` for a 404.
const GCS_OBJECT: &str = r#"
import sys, urllib.error, urllib.parse, urllib.request
url = "%s/download/storage/v1/b/%s/o/%s?alt=media" % (
    sys.argv[1], sys.argv[2], urllib.parse.quote(sys.argv[3], safe=""))
fetch(url)
"#;

/// `gcp-storage-emulator` on `127.0.0.1`, in memory, with a bucket; killed on drop.
#[derive(Debug)]
pub struct GcsEmulator {
    server: Server,
}

impl GcsEmulator {
    /// Start one with `bucket`; installs the emulator first when needed.
    pub fn start(bucket: &str) -> Result<GcsEmulator, FixtureError> {
        let mut check = Command::new("python3");
        check.args(["-c", "import gcp_storage_emulator"]);
        ensure(
            "gcp-storage-emulator",
            &mut check,
            &[
                &["python3", "-m", "pip", "install", "-q", GCS_EMULATOR],
                &[
                    "python3",
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--break-system-packages",
                    GCS_EMULATOR,
                ],
            ],
        )?;
        let mut command = Command::new("python3");
        command.args([
            "-m",
            "gcp_storage_emulator",
            "start",
            "--in-memory",
            "--host",
            "127.0.0.1",
            "--port",
        ]);
        let server = Server::start("gcp-storage-emulator", command, |port| {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })?;
        let gcs = GcsEmulator { server };
        python(
            "creating the GCS bucket",
            "import json, sys, urllib.request\n\
             req = urllib.request.Request(sys.argv[1] + '/storage/v1/b?project=slipway', \
             data=json.dumps({'name': sys.argv[2]}).encode(), \
             headers={'content-type': 'application/json'})\n\
             urllib.request.urlopen(req)",
            &[&gcs.url(), bucket],
        )?;
        Ok(gcs)
    }

    /// `http://127.0.0.1:PORT`, the `gcs_base_url` of a key file.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.server.port)
    }

    /// A service account key file whose URLs point here, its key a new 2048-bit RSA key
    /// (made with `openssl`), written into `dir`.
    pub fn key_file(&self, dir: &Path) -> Result<PathBuf, FixtureError> {
        let pem = dir.join("gcs-key.pem");
        let made = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&pem)
            .stderr(Stdio::null())
            .status()
            .map_err(|e| err("openssl genpkey", e))?;
        if !made.success() {
            return Err(err("openssl genpkey", "failed"));
        }
        let key = std::fs::read_to_string(&pem).map_err(|e| err("the RSA key", e))?;
        let json = serde_json::json!({
            "type": "service_account",
            "project_id": "slipway",
            "private_key_id": "0123456789abcdef",
            "private_key": key,
            "client_email": "cache@slipway.iam.gserviceaccount.com",
            "gcs_base_url": self.url(),
        });
        let file = dir.join("gcs-key.json");
        std::fs::write(&file, json.to_string()).map_err(|e| err("the key file", e))?;
        Ok(file)
    }

    /// Object `name` of `bucket`; `None` when there is none.
    pub fn object(&self, bucket: &str, name: &str) -> Result<Option<Vec<u8>>, FixtureError> {
        let out = python(
            "reading a GCS object",
            GCS_OBJECT,
            &[&self.url(), bucket, name],
        )?;
        Ok(out
            .split_first()
            .and_then(|(found, body)| (*found == b'1').then(|| body.to_vec())))
    }
}

/// An Azure Storage request signed with the account's shared key (argv: method, account URL,
/// account, key, path under the account, query as `k=v&…`); the answer's body on stdout,
/// prefixed `1`, or `0` for a 404. Azurite addresses the account by the URL's first segment,
/// so the canonical resource names it twice.
const AZURE_REQUEST: &str = r#"
import base64, email.utils, hashlib, hmac, sys, urllib.error, urllib.parse, urllib.request
method, url, account, key, path, query = sys.argv[1:7]
date = email.utils.formatdate(usegmt=True)
version = "2021-08-06"
params = sorted(urllib.parse.parse_qsl(query))
resource = "/" + account + urllib.parse.urlsplit(url).path + "/" + path
resource += "".join("\n%s:%s" % (k.lower(), v) for k, v in params)
string = "\n".join([method] + [""] * 11 + ["x-ms-date:%s\nx-ms-version:%s" % (date, version), resource])
sig = base64.b64encode(hmac.new(base64.b64decode(key), string.encode(), hashlib.sha256).digest())
full = url + "/" + urllib.parse.quote(path) + ("?" + query if query else "")
req = urllib.request.Request(full, method=method, headers={"x-ms-date": date,
    "x-ms-version": version, "Content-Length": "0",
    "Authorization": "SharedKey %s:%s" % (account, sig.decode())})
fetch(req)
"#;

/// Azurite's blob service on `127.0.0.1`, in memory, with a container; killed on drop.
#[derive(Debug)]
pub struct Azurite {
    server: Server,
}

impl Azurite {
    /// Start one with `container`; installs Azurite with npm first when needed.
    pub fn start(container: &str) -> Result<Azurite, FixtureError> {
        let mut check = Command::new("azurite-blob");
        check.arg("--version");
        ensure(
            "azurite",
            &mut check,
            &[&["npm", "install", "-g", "--silent", AZURITE]],
        )?;
        let mut command = Command::new("azurite-blob");
        command.args([
            "--silent",
            "--inMemoryPersistence",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
        ]);
        let server = Server::start("azurite", command, |port| {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })?;
        let azurite = Azurite { server };
        azurite.request("PUT", container, "restype=container")?;
        Ok(azurite)
    }

    /// The account's URL, `http://127.0.0.1:PORT/devstoreaccount1` (`BlobEndpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{AZURE_ACCOUNT}", self.server.port)
    }

    fn request(&self, method: &str, path: &str, query: &str) -> Result<Vec<u8>, FixtureError> {
        python(
            "an Azure Storage request",
            AZURE_REQUEST,
            &[
                method,
                &self.endpoint(),
                AZURE_ACCOUNT,
                AZURE_KEY,
                path,
                query,
            ],
        )
    }

    /// Blob `name` of `container`; `None` when there is none.
    pub fn object(&self, container: &str, name: &str) -> Result<Option<Vec<u8>>, FixtureError> {
        let out = self.request("GET", &format!("{container}/{name}"), "")?;
        Ok(out
            .split_first()
            .and_then(|(found, body)| (*found == b'1').then(|| body.to_vec())))
    }
}
