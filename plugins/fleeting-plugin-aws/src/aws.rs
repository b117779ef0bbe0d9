//! The AWS side: SDK configuration (credentials, region, retries) and the few API calls made.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_sdk_autoscaling::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_autoscaling::types::AutoScalingGroup;
use aws_sdk_ec2::types::Filter;

use crate::config::Config;

/// Attempts per API call, first try included. The SDK's *standard* retry mode retries throttling
/// errors (`Throttling`, `RequestLimitExceeded`, ...), 5xx and transient I/O failures with
/// exponential backoff and full jitter (1 s base, capped at [`MAX_BACKOFF`]).
pub const MAX_ATTEMPTS: u32 = 5;
/// Upper bound of one retry delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(20);
/// DescribeInstances accepts at most this many values per filter.
const FILTER_VALUES_MAX: usize = 200;

/// An AWS failure, with the API operation it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AwsError {
    /// No region anywhere in the chain.
    #[error(
        "no AWS region configured: set `region` in plugin_config, the AWS_REGION or \
         AWS_DEFAULT_REGION environment variable, or `region` in the profile of the shared config \
         file (`config_file` / AWS_CONFIG_FILE / ~/.aws/config); on EC2 the instance metadata \
         service is asked last"
    )]
    NoRegion,
    /// The configured Auto Scaling group does not exist.
    #[error("autoscaling group {name:?} not found in region {region}")]
    GroupNotFound {
        /// ASG name.
        name: String,
        /// Region searched.
        region: String,
    },
    /// An API call failed (after retries).
    #[error("{op}: {}{message}", code.as_deref().map(|c| format!("{c}: ")).unwrap_or_default())]
    Api {
        /// Operation, e.g. `DescribeAutoScalingGroups`.
        op: &'static str,
        /// AWS error code, e.g. `Throttling`, `SignatureDoesNotMatch`.
        code: Option<String>,
        /// What AWS (or the SDK) said.
        message: String,
    },
}

fn api<E, R>(op: &'static str, e: SdkError<E, R>) -> AwsError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    let code = e.code().map(str::to_owned);
    let message = match (e.code(), e.message()) {
        (Some(_), Some(m)) => m.to_owned(),
        // Dispatch/timeout/construction failures: the whole source chain says what happened.
        _ => DisplayErrorContext(&e).to_string(),
    };
    AwsError::Api { op, code, message }
}

/// What EC2 says about one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ec2Instance {
    /// EC2 state name (`pending`, `running`, `terminated`, ...).
    pub state: String,
    /// Private IPv4 address.
    pub private_ip: Option<String>,
    /// Public IPv4 address.
    pub public_ip: Option<String>,
    /// Availability zone (needed by `SendSSHPublicKey`).
    pub availability_zone: Option<String>,
    /// EC2 architecture (`x86_64`, `arm64`).
    pub architecture: Option<String>,
    /// `windows` for Windows instances.
    pub platform: Option<String>,
}

/// The three SDK clients, built from one configuration.
#[derive(Clone)]
pub struct Clients {
    /// Region in use.
    pub region: String,
    autoscaling: aws_sdk_autoscaling::Client,
    ec2: aws_sdk_ec2::Client,
    connect: aws_sdk_ec2instanceconnect::Client,
}

impl fmt::Debug for Clients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The SDK config holds the credentials provider: print only the region.
        f.debug_struct("Clients")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl Clients {
    /// Resolve credentials, region and endpoint the SDK's standard way, with `config` on top.
    pub async fn new(config: &Config) -> Result<Clients, AwsError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(MAX_ATTEMPTS)
                    .with_max_backoff(MAX_BACKOFF),
            )
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(10))
                    .operation_attempt_timeout(Duration::from_secs(30))
                    .build(),
            );
        if let Some(profile) = &config.profile {
            loader = loader.profile_name(profile);
        }
        if config.config_file.is_some() || config.credentials_file.is_some() {
            // A configured file replaces the default one of its kind; the other kind stays.
            let mut files = EnvConfigFiles::builder();
            files = match &config.config_file {
                Some(path) => files.with_file(EnvConfigFileKind::Config, path),
                None => files.include_default_config_file(true),
            };
            files = match &config.credentials_file {
                Some(path) => files.with_file(EnvConfigFileKind::Credentials, path),
                None => files.include_default_credentials_file(true),
            };
            loader = loader.profile_files(files.build());
        }
        if let Some(region) = &config.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(url) = &config.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        let sdk = loader.load().await;
        let region = sdk.region().ok_or(AwsError::NoRegion)?.to_string();
        Ok(Clients {
            region,
            autoscaling: aws_sdk_autoscaling::Client::new(&sdk),
            ec2: aws_sdk_ec2::Client::new(&sdk),
            connect: aws_sdk_ec2instanceconnect::Client::new(&sdk),
        })
    }

    /// The named group, or `None` when it does not exist.
    pub async fn group(&self, name: &str) -> Result<Option<AutoScalingGroup>, AwsError> {
        let out = self
            .autoscaling
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(name)
            .send()
            .await
            .map_err(|e| api("DescribeAutoScalingGroups", e))?;
        Ok(out
            .auto_scaling_groups
            .unwrap_or_default()
            .into_iter()
            .find(|g| g.auto_scaling_group_name() == Some(name)))
    }

    /// The named group, or [`AwsError::GroupNotFound`].
    pub async fn existing_group(&self, name: &str) -> Result<AutoScalingGroup, AwsError> {
        self.group(name)
            .await?
            .ok_or_else(|| AwsError::GroupNotFound {
                name: name.to_owned(),
                region: self.region.clone(),
            })
    }

    /// Set the group's desired capacity, ignoring cooldowns (the taskscaler decides pacing).
    pub async fn set_desired_capacity(&self, name: &str, desired: i32) -> Result<(), AwsError> {
        self.autoscaling
            .set_desired_capacity()
            .auto_scaling_group_name(name)
            .desired_capacity(desired)
            .honor_cooldown(false)
            .send()
            .await
            .map_err(|e| api("SetDesiredCapacity", e))?;
        Ok(())
    }

    /// Terminate one instance and lower the desired capacity so the ASG does not replace it.
    pub async fn terminate(&self, id: &str) -> Result<(), AwsError> {
        self.autoscaling
            .terminate_instance_in_auto_scaling_group()
            .instance_id(id)
            .should_decrement_desired_capacity(true)
            .send()
            .await
            .map_err(|e| api("TerminateInstanceInAutoScalingGroup", e))?;
        Ok(())
    }

    /// EC2's view of these instances; ids EC2 does not know are absent from the map.
    pub async fn instances(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, Ec2Instance>, AwsError> {
        let mut found = HashMap::new();
        // An `instance-id` filter, not `InstanceIds`: one unknown id would fail the whole call
        // with InvalidInstanceID.NotFound. An empty filter would list every instance: skip.
        for chunk in ids.chunks(FILTER_VALUES_MAX) {
            let filter = Filter::builder()
                .name("instance-id")
                .set_values(Some(chunk.to_vec()))
                .build();
            let mut token = None;
            loop {
                let out = self
                    .ec2
                    .describe_instances()
                    .filters(filter.clone())
                    .set_next_token(token)
                    .send()
                    .await
                    .map_err(|e| api("DescribeInstances", e))?;
                for inst in out.reservations().iter().flat_map(|r| r.instances()) {
                    let Some(id) = inst.instance_id() else {
                        continue;
                    };
                    found.insert(
                        id.to_owned(),
                        Ec2Instance {
                            state: inst
                                .state()
                                .and_then(|s| s.name())
                                .map(|n| n.as_str().to_owned())
                                .unwrap_or_default(),
                            private_ip: inst.private_ip_address().map(str::to_owned),
                            public_ip: inst.public_ip_address().map(str::to_owned),
                            availability_zone: inst
                                .placement()
                                .and_then(|p| p.availability_zone())
                                .map(str::to_owned),
                            architecture: inst.architecture().map(|a| a.as_str().to_owned()),
                            platform: inst.platform().map(|p| p.as_str().to_owned()),
                        },
                    );
                }
                token = out.next_token;
                if token.as_deref().is_none_or(str::is_empty) {
                    break;
                }
            }
        }
        Ok(found)
    }

    /// Push a public key that `os_user` may log in with for the next 60 seconds.
    pub async fn send_ssh_public_key(
        &self,
        id: &str,
        os_user: &str,
        availability_zone: &str,
        public_key: &str,
    ) -> Result<(), AwsError> {
        let out = self
            .connect
            .send_ssh_public_key()
            .instance_id(id)
            .instance_os_user(os_user)
            .availability_zone(availability_zone)
            .ssh_public_key(public_key)
            .send()
            .await
            .map_err(|e| api("SendSSHPublicKey", e))?;
        if !out.success() {
            return Err(AwsError::Api {
                op: "SendSSHPublicKey",
                code: None,
                message: format!("EC2 Instance Connect did not accept the key for {id}"),
            });
        }
        Ok(())
    }
}
