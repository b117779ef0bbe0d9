//! A real moto server (AWS's APIs, from PyPI) on a loopback port, with Auto Scaling groups made
//! through boto3, for benches and manager-level tests that run `fleeting-plugin-aws`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{FixtureError, err};

/// The region groups live in.
pub const REGION: &str = "us-east-1";

const IMPORT_CHECK: &str = "import moto.server, flask, flask_cors, boto3";

/// Make one launch template and one Auto Scaling group per name (argv: url, region, max size,
/// names...), scale-in protection on as the plugin expects.
const CREATE_GROUPS: &str = r#"
import boto3, sys
url, region, max_size, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
kw = dict(endpoint_url=url, region_name=region,
          aws_access_key_id="test", aws_secret_access_key="test")
ec2 = boto3.client("ec2", **kw)
asg = boto3.client("autoscaling", **kw)
for name in names:
    # An Amazon Linux AMI of moto's catalogue: EC2 Instance Connect refuses Windows instances.
    ec2.create_launch_template(LaunchTemplateName=name + "-template",
        LaunchTemplateData={"ImageId": "ami-760aaa0f", "InstanceType": "t3.micro"})
    asg.create_auto_scaling_group(AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name + "-template"}, MinSize=0, MaxSize=max_size,
        DesiredCapacity=0, AvailabilityZones=[region + "a"],
        NewInstancesProtectedFromScaleIn=True)
"#;

fn importable() -> bool {
    Command::new("python3")
        .args(["-c", IMPORT_CHECK])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// moto's server mode importable, installed with pip when missing (as `scripts/deps.sh` does).
pub fn ensure_moto() -> Result<(), FixtureError> {
    if importable() {
        return Ok(());
    }
    // Debian's python3 refuses system-wide installs (PEP 668) unless told otherwise.
    for extra in [&[][..], &["--break-system-packages"][..]] {
        let _ = Command::new("python3")
            .args(["-m", "pip", "install", "-q"])
            .args(extra)
            .arg("moto[server]")
            .status();
        if importable() {
            return Ok(());
        }
    }
    Err(err(
        "moto",
        "python3 cannot import moto.server, and `python3 -m pip install 'moto[server]'` did not fix it",
    ))
}

/// A running moto server, killed on drop.
#[derive(Debug)]
pub struct Moto {
    child: tokio::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Moto {
    /// Start moto on a free port, its log in `dir/moto.log`.
    pub async fn start(dir: &Path) -> Result<Moto, FixtureError> {
        tokio::task::spawn_blocking(ensure_moto)
            .await
            .map_err(|e| err("moto", e))??;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| err("a free port", e))?
            .port();
        let log = std::fs::File::create(dir.join("moto.log")).map_err(|e| err("moto.log", e))?;
        let child = tokio::process::Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| err("starting moto", e))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(err("moto", format!("did not listen on {port} within 60 s")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        })
    }

    /// Create an Auto Scaling group (desired 0, at most `max_size`) per name.
    pub async fn create_groups(&self, names: &[&str], max_size: u32) -> Result<(), FixtureError> {
        let out = tokio::process::Command::new("python3")
            .args(["-c", CREATE_GROUPS, &self.url, REGION])
            .arg(max_size.to_string())
            .args(names)
            .output()
            .await
            .map_err(|e| err("running python3", e))?;
        if !out.status.success() {
            return Err(err(
                "creating groups in moto",
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        Ok(())
    }

    /// The environment that points the AWS SDK (and so `fleeting-plugin-aws`) at `endpoint`
    /// (this server, or a fault proxy in front of it).
    pub fn env_for(endpoint: &str) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", REGION),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// [`Moto::env_for`] this server.
    pub fn env(&self) -> Vec<(String, String)> {
        Self::env_for(&self.url)
    }

    /// Kill the server and wait for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
