//! [`LocalStack`]: a real S3-compatible server (LocalStack's own S3 provider, from PyPI) on a
//! loopback port, with signature checking on, and a bucket made for the test.
//!
//! LocalStack runs from a virtual environment of its own with pinned versions (4.4.0 is the
//! newest that runs on this machine's Python 3.11; a few of its dependencies need older
//! releases): `scripts/deps.sh test` makes it, and [`LocalStack::start`] makes it when missing.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{FixtureError, err, kill_tree};

/// What the virtual environment holds.
pub const PACKAGES: &[&str] = &[
    "localstack-core[runtime]==4.4.0",
    "cbor2<5.7",
    "pyOpenSSL<24.3",
    "cryptography<44",
    "joserfc<1.1",
    "service_identity",
];

/// The access key the URLs are signed with (LocalStack takes any).
pub const ACCESS_KEY: &str = "AKIASLIPWAYTEST0001";
/// The secret key: LocalStack checks every signature against the secret `test`, so a URL
/// signed with any other secret is refused.
pub const SECRET_KEY: &str = "test";

/// Where the virtual environment lives: `$SLIPWAY_LOCALSTACK_VENV`, else
/// `~/.cache/slipway/localstack-4.4.0`.
pub fn venv() -> PathBuf {
    if let Some(v) = std::env::var_os("SLIPWAY_LOCALSTACK_VENV") {
        return PathBuf::from(v);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/slipway/localstack-4.4.0")
}

fn python() -> PathBuf {
    venv().join("bin/python")
}

fn ready() -> bool {
    Command::new(python())
        .args(["-c", "import localstack.aws.components, boto3"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Make the virtual environment when it cannot run LocalStack yet.
pub fn ensure_installed() -> Result<(), FixtureError> {
    if ready() {
        return Ok(());
    }
    let dir = venv();
    // Tests start at once: one installs, the others wait for it.
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| err("LocalStack's directory", e))?;
    }
    let lock = std::fs::File::create(dir.with_extension("lock"))
        .map_err(|e| err("LocalStack's install lock", e))?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| err("LocalStack's install lock", e))?;
    if ready() {
        return Ok(());
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&dir)
        .status()
        .map_err(|e| err("python3 -m venv", e))?;
    if !made.success() {
        return Err(err(
            "LocalStack",
            format!("python3 -m venv {} failed", dir.display()),
        ));
    }
    let pip = Command::new(python())
        .args(["-m", "pip", "install", "--quiet"])
        .args(PACKAGES)
        .status()
        .map_err(|e| err("pip install localstack-core", e))?;
    if !pip.success() || !ready() {
        return Err(err(
            "LocalStack",
            format!(
                "pip install {} into {} failed",
                PACKAGES.join(" "),
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// A LocalStack S3 on `127.0.0.1`, killed (with its children) on drop.
#[derive(Debug)]
pub struct LocalStack {
    child: Child,
    ip: std::net::IpAddr,
    port: u16,
    _data: tempfile::TempDir,
}

impl Drop for LocalStack {
    fn drop(&mut self) {
        kill_tree(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LocalStack {
    /// Start one and make `bucket` in it; installs LocalStack first when needed.
    pub fn start(bucket: &str) -> Result<LocalStack, FixtureError> {
        Self::start_on(bucket, std::net::Ipv4Addr::LOCALHOST.into())
    }

    /// [`LocalStack::start`] listening on `ip` (the Docker bridge's gateway, which jobs in
    /// containers reach too).
    pub fn start_on(bucket: &str, ip: std::net::IpAddr) -> Result<LocalStack, FixtureError> {
        ensure_installed()?;
        let port = std::net::TcpListener::bind((ip, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| err("a free port", e))?
            .port();
        let data = tempfile::tempdir().map_err(|e| err("LocalStack's directory", e))?;
        let log = std::fs::File::create(data.path().join("localstack.log"))
            .map_err(|e| err("LocalStack's log", e))?;
        let child = Command::new(python())
            .args(["-m", "localstack.runtime.main"])
            .env("GATEWAY_LISTEN", format!("{ip}:{port}"))
            .env("SERVICES", "s3")
            .env("DNS_ADDRESS", "0")
            .env("S3_SKIP_SIGNATURE_VALIDATION", "0")
            .env("LOCALSTACK_VOLUME_DIR", data.path())
            .env("FILESYSTEM_ROOT", data.path())
            .env("SKIP_SSL_CERT_DOWNLOAD", "1")
            .stdout(log.try_clone().map_err(|e| err("LocalStack's log", e))?)
            .stderr(log)
            .spawn()
            .map_err(|e| err("starting LocalStack", e))?;
        let ls = LocalStack {
            child,
            ip,
            port,
            _data: data,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if ls.make_bucket(bucket).is_ok() {
                return Ok(ls);
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(ls._data.path().join("localstack.log"))
                    .unwrap_or_default();
                return Err(err("LocalStack", format!("not ready within 120 s:\n{log}")));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `IP:PORT` (`127.0.0.1:PORT` unless started elsewhere), as `ServerAddress` takes it.
    pub fn address(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    fn boto(&self, code: &str) -> Result<String, FixtureError> {
        self.boto_bytes(code)
            .map(|out| String::from_utf8_lossy(&out).into_owned())
    }

    /// What `code` wrote to stdout, as bytes (objects are binary).
    fn boto_bytes(&self, code: &str) -> Result<Vec<u8>, FixtureError> {
        let script = format!(
            "import boto3\nfrom botocore.config import Config\n\
             s3 = boto3.client('s3', endpoint_url='http://{}', \
             aws_access_key_id='{ACCESS_KEY}', aws_secret_access_key='{SECRET_KEY}', \
             region_name='us-east-1', config=Config(signature_version='s3v4'))\n{code}",
            self.address()
        );
        let out = Command::new(python())
            .args(["-c", &script])
            .output()
            .map_err(|e| err("boto3", e))?;
        if !out.status.success() {
            return Err(err("boto3", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(out.stdout)
    }

    fn make_bucket(&self, bucket: &str) -> Result<(), FixtureError> {
        self.boto(&format!("s3.create_bucket(Bucket='{bucket}')"))
            .map(|_| ())
    }

    /// The object names in `bucket`, sorted.
    pub fn objects(&self, bucket: &str) -> Result<Vec<String>, FixtureError> {
        let out = self.boto(&format!(
            "for o in sorted(o['Key'] for o in s3.list_objects_v2(Bucket='{bucket}').get('Contents', [])): print(o)"
        ))?;
        Ok(out.lines().map(str::to_string).collect())
    }

    /// Object `key` of `bucket`.
    pub fn object(&self, bucket: &str, key: &str) -> Result<Vec<u8>, FixtureError> {
        self.boto_bytes(&format!(
            "import sys\nsys.stdout.buffer.write(s3.get_object(Bucket='{bucket}', Key='{key}')['Body'].read())"
        ))
    }
}
