//! [`AwsGroup`]: the [`InstanceGroup`] implementation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_autoscaling::types::AutoScalingGroup;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};

use crate::aws::{AwsError, Clients};
use crate::config::Config;
use crate::keys::KeyPair;
use crate::state::{arch, instance_state, unlisted_state};

/// How long a key pushed with EC2 Instance Connect is accepted by the instance.
pub const INSTANCE_CONNECT_KEY_LIFETIME: Duration = Duration::from_secs(60);

/// The AWS Auto Scaling group. Create with `Default`, then `init`.
#[derive(Debug, Default)]
pub struct AwsGroup {
    ready: OnceLock<Ready>,
    // Ids reported by the last Update that were not yet reported deleted.
    known: Mutex<BTreeSet<String>>,
    // Serialises Increase's read-modify-write of the desired capacity.
    scale: tokio::sync::Mutex<()>,
}

/// Everything `init` established.
#[derive(Debug)]
struct Ready {
    config: Config,
    clients: Clients,
    connector: ConnectorConfig,
}

/// AWS error codes that mean "no capacity for this now": told apart from other failures, so
/// that a runner can turn to a fallback (on-demand) shape.
pub const CAPACITY_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "SpotMaxPriceTooLow",
    "UnfulfillableCapacity",
    "MaxSpotInstanceCountExceeded",
    "InsufficientCapacity",
];

impl From<AwsError> for GroupError {
    fn from(e: AwsError) -> Self {
        match &e {
            AwsError::NoRegion | AwsError::GroupNotFound { .. } => {
                GroupError::InvalidArgument(e.to_string())
            }
            AwsError::Api {
                code: Some(code), ..
            } if CAPACITY_CODES.contains(&code.as_str()) => GroupError::Capacity(e.to_string()),
            _ => GroupError::Provider(e.to_string()),
        }
    }
}

/// Members of a group: id → ASG lifecycle state.
fn members(group: &AutoScalingGroup) -> BTreeMap<String, String> {
    group
        .instances()
        .iter()
        .filter_map(|i| {
            let id = i.instance_id()?.to_owned();
            let lifecycle = i
                .lifecycle_state()
                .map(|l| l.as_str().to_owned())
                .unwrap_or_default();
            Some((id, lifecycle))
        })
        .collect()
}

fn with_defaults(connector: &ConnectorConfig) -> ConnectorConfig {
    // `os` stays empty here: ConnectInfo fills it from the instance's platform (linux/windows).
    let mut c = connector.clone();
    if c.protocol.is_empty() {
        c.protocol = "ssh".into();
    }
    if c.username.is_empty() {
        // The user of Amazon Linux AMIs, as GitLab's plugin defaults.
        c.username = "ec2-user".into();
    }
    c
}

impl AwsGroup {
    fn ready(&self) -> Result<&Ready, GroupError> {
        self.ready
            .get()
            .ok_or_else(|| GroupError::FailedPrecondition("init has not been called".into()))
    }

    fn known(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        // Only whole-set replacements happen under this lock: a poisoned set is still valid.
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The group's member `id` with its state, or `NotFound`.
    async fn member_state(&self, id: &str) -> Result<(State, crate::aws::Ec2Instance), GroupError> {
        let ready = self.ready()?;
        let group = ready.clients.existing_group(&ready.config.name).await?;
        let lifecycle = members(&group)
            .remove(id)
            .ok_or_else(|| GroupError::NotFound(id.to_owned()))?;
        let ec2 = ready
            .clients
            .instances(&[id.to_owned()])
            .await?
            .remove(id)
            .unwrap_or_default();
        let state = instance_state(
            &lifecycle,
            Some(ec2.state.as_str()).filter(|s| !s.is_empty()),
        );
        Ok((state, ec2))
    }
}

#[async_trait]
impl InstanceGroup for AwsGroup {
    async fn init(
        &self,
        plugin_config: &[u8],
        connector: &ConnectorConfig,
    ) -> Result<ProviderInfo, GroupError> {
        if self.ready.get().is_some() {
            return Err(GroupError::FailedPrecondition("init called twice".into()));
        }
        let config =
            Config::parse(plugin_config).map_err(|e| GroupError::InvalidArgument(e.to_string()))?;
        let clients = Clients::new(&config).await?;
        // Also proves the credentials work before the taskscaler relies on the group.
        let group = clients.existing_group(&config.name).await?;
        if !group
            .new_instances_protected_from_scale_in()
            .unwrap_or(false)
        {
            tracing::warn!(
                group = %config.name,
                "scale-in protection is off (NewInstancesProtectedFromScaleIn = false): the ASG \
                 may terminate instances that are running jobs; turn it on"
            );
        }
        let rebalancing = !group
            .suspended_processes()
            .iter()
            .any(|p| p.process_name() == Some("AZRebalance"));
        if rebalancing {
            tracing::warn!(
                group = %config.name,
                "the AZRebalance process is not suspended: the ASG may terminate instances that \
                 are running jobs to rebalance zones; suspend it"
            );
        }
        let max_size = u64::try_from(group.max_size().unwrap_or(0)).unwrap_or(0);
        let info = ProviderInfo {
            id: format!("aws/{}/{}", clients.region, config.name),
            max_size,
            version: env!("CARGO_PKG_VERSION").into(),
            build_info: "fleeting-plugin-aws (aws-sdk-rust)".into(),
            capabilities: vec![],
        };
        tracing::info!(group = %config.name, region = %clients.region, max_size, "aws group ready");
        let ready = Ready {
            config,
            clients,
            connector: with_defaults(connector),
        };
        self.ready
            .set(ready)
            .map_err(|_| GroupError::FailedPrecondition("init called twice".into()))?;
        Ok(info)
    }

    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        let ready = self.ready()?;
        let listed = match ready.clients.group(&ready.config.name).await? {
            Some(group) => members(&group),
            None => {
                // Not an error loop: the group is gone, so are its instances as far as the
                // taskscaler is concerned (each reported deleted once).
                tracing::warn!(group = %ready.config.name, "autoscaling group no longer exists");
                BTreeMap::new()
            }
        };
        let gone: Vec<String> = self
            .known()
            .iter()
            .filter(|id| !listed.contains_key(*id))
            .cloned()
            .collect();
        let ids: Vec<String> = listed.keys().cloned().chain(gone.iter().cloned()).collect();
        let ec2 = ready.clients.instances(&ids).await?;
        let ec2_state = |id: &str| {
            ec2.get(id)
                .map(|i| i.state.as_str())
                .filter(|s| !s.is_empty())
        };
        let mut out = Vec::with_capacity(ids.len());
        let mut still_known = BTreeSet::new();
        for (id, lifecycle) in &listed {
            let state = instance_state(lifecycle, ec2_state(id));
            if state != State::Deleted {
                still_known.insert(id.clone());
            }
            out.push((id.clone(), state));
        }
        for id in gone {
            // Left the group: terminated by us, replaced by the ASG, detached, or group deleted.
            let state = unlisted_state(ec2_state(&id));
            if state != State::Deleted {
                still_known.insert(id.clone());
            }
            out.push((id, state));
        }
        *self.known() = still_known;
        Ok(out)
    }

    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        let ready = self.ready()?;
        let _serial = self.scale.lock().await;
        let group = ready.clients.existing_group(&ready.config.name).await?;
        let desired = group.desired_capacity().unwrap_or(0).max(0);
        let max = group.max_size().unwrap_or(0).max(0);
        let delta = i32::try_from(delta).unwrap_or(i32::MAX);
        let target = desired.saturating_add(delta).min(max);
        if target <= desired {
            return Ok(0);
        }
        ready
            .clients
            .set_desired_capacity(&ready.config.name, target)
            .await?;
        let added = u32::try_from(target - desired).unwrap_or(0);
        tracing::info!(group = %ready.config.name, from = desired, to = target, "desired capacity raised");
        Ok(added)
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        let ready = self.ready()?;
        let group = ready.clients.existing_group(&ready.config.name).await?;
        let listed = members(&group);
        let mut accepted = Vec::new();
        let mut first_error = None;
        for id in ids {
            // Only our own members: TerminateInstanceInAutoScalingGroup would also terminate an
            // instance of another group this account owns.
            if !listed.contains_key(id) {
                tracing::warn!(instance = %id, "not a member of the group: not terminated");
                continue;
            }
            match ready.clients.terminate(id).await {
                Ok(()) => accepted.push(id.clone()),
                Err(e) => {
                    tracing::warn!(instance = %id, error = %e, "terminate failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if accepted.is_empty() => Err(e.into()),
            _ => Ok(accepted),
        }
    }

    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        let ready = self.ready()?;
        let (state, ec2) = self.member_state(id).await?;
        if state != State::Running {
            return Err(GroupError::FailedPrecondition(format!(
                "instance {id} is {state}, not running"
            )));
        }
        let private_ip = ec2.private_ip.clone().ok_or_else(|| {
            GroupError::Provider(format!("instance {id} has no private IP address"))
        })?;
        let mut connector = ready.connector.clone();
        if connector.arch.is_empty()
            && let Some(a) = &ec2.architecture
        {
            connector.arch = arch(a).to_owned();
        }
        if connector.os.is_empty() {
            connector.os = if ec2.platform.as_deref() == Some("windows") {
                "windows".into()
            } else {
                "linux".into()
            };
        }
        let mut expires = None;
        if !connector.use_static_credentials {
            if connector.os == "windows" {
                // EC2 Instance Connect pushes SSH keys to Linux instances only.
                return Err(GroupError::FailedPrecondition(format!(
                    "instance {id} runs Windows: EC2 Instance Connect cannot provision \
                     credentials for it; set connector_config use_static_credentials = true"
                )));
            }
            let zone = ec2.availability_zone.as_deref().ok_or_else(|| {
                GroupError::Provider(format!("instance {id} has no availability zone"))
            })?;
            let key = KeyPair::generate().map_err(|e| GroupError::Provider(e.to_string()))?;
            // Counted from before the push, so the key never outlives what we promise.
            let valid_until = SystemTime::now() + INSTANCE_CONNECT_KEY_LIFETIME;
            ready
                .clients
                .send_ssh_public_key(id, &connector.username, zone, key.public_openssh())
                .await?;
            connector.key = key.into_private_openssh();
            connector.password.clear();
            expires = Some(valid_until);
        }
        Ok(ConnectInfo {
            id: id.to_owned(),
            connector,
            internal_addr: private_ip,
            external_addr: ec2.public_ip.unwrap_or_default(),
            expires,
        })
    }

    async fn heartbeat(&self, id: &str) -> Result<(), GroupError> {
        match self.member_state(id).await? {
            (State::Running, _) => Ok(()),
            (state, _) => Err(GroupError::Provider(format!(
                "instance {id} is {state}, not running"
            ))),
        }
    }

    async fn shutdown(&self) -> Result<(), GroupError> {
        // Nothing to clean: no background tasks, no files, and instances belong to the ASG
        // (stopping the manager must not scale the group in).
        Ok(())
    }
}
