//! Test fixtures: a real moto server, an ASG in it, and a fault-injecting proxy in front of it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use aws_config::BehaviorVersion;
use aws_sdk_autoscaling::types::LaunchTemplateSpecification;
use aws_sdk_ec2::types::RequestLaunchTemplateData;

/// Region every test uses.
pub const REGION: &str = "eu-west-1";
/// moto accepts any key pair while IAM auth is off.
pub const ACCESS_KEY: &str = "AKIATESTTESTTESTTEST";
/// Secret of [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "test-secret";
/// An Amazon Linux AMI from moto's built-in catalogue.
pub const LINUX_AMI: &str = "ami-760aaa0f";
/// A Windows Server AMI from moto's built-in catalogue (instances get `Platform = windows`).
pub const WINDOWS_AMI: &str = "ami-12c6146b";

/// Install moto's server mode once per test process if it is missing (as scripts/deps.sh does).
fn ensure_moto() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| slipway_testkit::moto::ensure_moto().map_err(|e| e.to_string()))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A moto server on a loopback port, killed on drop.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Moto {
    /// Start moto with IAM auth off.
    pub async fn start() -> anyhow::Result<Moto> {
        Self::start_with(&[]).await
    }

    /// Start moto with extra environment (e.g. `INITIAL_NO_AUTH_ACTION_COUNT`).
    pub async fn start_with(env: &[(&str, &str)]) -> anyhow::Result<Moto> {
        tokio::task::spawn_blocking(ensure_moto).await??;
        let port = free_port()?;
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting moto")?;
        let moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if started.elapsed() > Duration::from_secs(60) {
                bail!("moto did not listen on port {port} within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(moto)
    }

    /// Setup-side SDK configuration with explicit credentials (no chain, no IMDS).
    pub async fn sdk(&self, access: &str, secret: &str) -> aws_config::SdkConfig {
        aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(&self.url)
            .region(aws_config::Region::new(REGION))
            .credentials_provider(aws_sdk_autoscaling::config::Credentials::new(
                access, secret, None, None, "test",
            ))
            .load()
            .await
    }

    /// Create a launch template and an ASG (desired 0, scale-in protection on).
    pub async fn create_group(&self, name: &str, max_size: i32) -> anyhow::Result<Asg> {
        let sdk = self.sdk(ACCESS_KEY, SECRET_KEY).await;
        create_group(&sdk, name, max_size, LINUX_AMI).await
    }

    /// Like [`Moto::create_group`], launching `ami`.
    pub async fn create_group_with(
        &self,
        name: &str,
        max_size: i32,
        ami: &str,
    ) -> anyhow::Result<Asg> {
        let sdk = self.sdk(ACCESS_KEY, SECRET_KEY).await;
        create_group(&sdk, name, max_size, ami).await
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        slipway_testkit::kill_tree(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An Auto Scaling group in moto, seen through the SDK (to check what the plugin did).
#[derive(Debug, Clone)]
pub struct Asg {
    /// ASG name.
    pub name: String,
    /// Setup/inspection client.
    pub autoscaling: aws_sdk_autoscaling::Client,
    /// Setup/inspection client.
    pub ec2: aws_sdk_ec2::Client,
}

/// Create a launch template and an ASG through `sdk`.
pub async fn create_group(
    sdk: &aws_config::SdkConfig,
    name: &str,
    max_size: i32,
    ami: &str,
) -> anyhow::Result<Asg> {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let autoscaling = aws_sdk_autoscaling::Client::new(sdk);
    let template = format!("{name}-template");
    ec2.create_launch_template()
        .launch_template_name(&template)
        .launch_template_data(
            RequestLaunchTemplateData::builder()
                .image_id(ami)
                .instance_type(aws_sdk_ec2::types::InstanceType::T3Micro)
                .build(),
        )
        .send()
        .await
        .context("CreateLaunchTemplate")?;
    autoscaling
        .create_auto_scaling_group()
        .auto_scaling_group_name(name)
        .launch_template(
            LaunchTemplateSpecification::builder()
                .launch_template_name(&template)
                .build(),
        )
        .min_size(0)
        .max_size(max_size)
        .desired_capacity(0)
        .availability_zones(format!("{REGION}a"))
        .new_instances_protected_from_scale_in(true)
        .send()
        .await
        .context("CreateAutoScalingGroup")?;
    Ok(Asg {
        name: name.into(),
        autoscaling,
        ec2,
    })
}

impl Asg {
    /// Desired capacity and member ids, as AWS reports them.
    pub async fn describe(&self) -> anyhow::Result<(i32, Vec<String>)> {
        let out = self
            .autoscaling
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(&self.name)
            .send()
            .await?;
        let group = out
            .auto_scaling_groups()
            .first()
            .context("group not found")?;
        let ids = group
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        Ok((group.desired_capacity().unwrap_or(-1), ids))
    }

    /// EC2 state name of one instance.
    pub async fn ec2_state(&self, id: &str) -> anyhow::Result<String> {
        let out = self
            .ec2
            .describe_instances()
            .instance_ids(id)
            .send()
            .await?;
        let inst = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .next()
            .context("instance not found")?;
        Ok(inst
            .state()
            .and_then(|s| s.name())
            .map(|n| n.as_str().to_owned())
            .unwrap_or_default())
    }
}

/// Shared config + credentials files for the plugin's `config_file` / `credentials_file` keys.
#[derive(Debug)]
pub struct Profile {
    _dir: tempfile::TempDir,
    /// `config` (region of profile `moto`).
    pub config_file: PathBuf,
    /// `credentials` (keys of profile `moto`).
    pub credentials_file: PathBuf,
}

impl Profile {
    /// Profile `moto` with these keys and [`REGION`].
    pub fn new(access: &str, secret: &str) -> anyhow::Result<Profile> {
        let dir = tempfile::tempdir()?;
        let config_file = dir.path().join("config");
        let credentials_file = dir.path().join("credentials");
        std::fs::write(&config_file, format!("[profile moto]\nregion = {REGION}\n"))?;
        std::fs::write(
            &credentials_file,
            format!("[moto]\naws_access_key_id = {access}\naws_secret_access_key = {secret}\n"),
        )?;
        Ok(Profile {
            _dir: dir,
            config_file,
            credentials_file,
        })
    }

    /// `plugin_config` for group `name` reached at `endpoint`, credentials from this profile.
    pub fn plugin_config(&self, name: &str, endpoint: &str) -> Vec<u8> {
        serde_json::json!({
            "name": name,
            "profile": "moto",
            "config_file": self.config_file,
            "credentials_file": self.credentials_file,
            "endpoint_url": endpoint,
        })
        .to_string()
        .into_bytes()
    }
}

/// Create an IAM user allowed everything and return its access key (needs moto started with
/// `INITIAL_NO_AUTH_ACTION_COUNT=3`: these are the three unauthenticated actions).
pub async fn create_iam_key(moto: &Moto) -> anyhow::Result<(String, String)> {
    let script = r#"
import boto3, json
iam = boto3.client("iam")
iam.create_user(UserName="slipway")
iam.put_user_policy(UserName="slipway", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
k = iam.create_access_key(UserName="slipway")["AccessKey"]
print(k["AccessKeyId"], k["SecretAccessKey"])
"#;
    let out = tokio::process::Command::new("python3")
        .args(["-c", script])
        .env("AWS_ENDPOINT_URL", &moto.url)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_DEFAULT_REGION", REGION)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .await?;
    if !out.status.success() {
        bail!("IAM setup: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    let (id, secret) = text.trim().split_once(' ').context("IAM setup output")?;
    Ok((id.to_owned(), secret.to_owned()))
}
