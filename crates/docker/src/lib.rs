//! A lean Docker Engine API client: HTTP/1.1 over the local unix socket or over any byte stream
//! a [`Dialer`] opens (e.g. `docker system dial-stdio` on an SSH channel), API version
//! negotiation, and one module per resource. The foundation of the docker and
//! docker-autoscaler executors.
//!
//! Modules, all private (their items are re-exported here):
//!
//! - `client`: the [`Docker`] handle: HTTP/1.1 over dialed streams, a small keep-alive pool,
//!   API version negotiation, and the request/response plumbing the resource modules share.
//! - `transport`: how bytes reach the engine: one fresh stream per HTTP connection from a
//!   [`Dialer`] ([`UnixDialer`], [`CommandDialer`], [`FnDialer`]).
//! - `containers`: create, start, attach, logs, wait, kill, stop, remove, inspect, list.
//! - `exec`: run a process (a step script) in a running container, with stdin.
//! - `images`: inspect, list, pull (with progress), import from a tar, remove.
//! - `networks`: a user-defined bridge per job, so services are reachable by alias.
//! - `volumes`: named volumes for caches and builds directories.
//! - `system`: `/_ping` and `/version`.
//! - `cleanup`: removes everything a job left behind, found by label.
//! - `stream`: decoders for the multiplexed stdout/stderr frames of attach, logs and exec, for
//!   JSON progress streams (pull, import), and the hijacked attach/exec connection.
//! - `error`: the crate's one error type, [`Error`].
//!
//! ```no_run
//! # async fn demo() -> slipway_docker::Result<()> {
//! use slipway_docker::{CommandDialer, ContainerSpec, Docker, Transport, WaitCondition};
//! // Local socket, or: Transport::command(CommandDialer::docker_dial_stdio())
//! let docker = Docker::connect(Transport::unix("/var/run/docker.sock")).await?;
//! let mut spec = ContainerSpec::new("slipway-busybox:latest");
//! spec.cmd = Some(vec!["sh".into(), "-c".into(), "echo hi".into()]);
//! let id = docker.create_container(&spec).await?.id;
//! docker.start_container(&id).await?;
//! let code = docker.wait_container(&id, WaitCondition::NotRunning).await?;
//! docker.remove_container(&id, true, true).await?;
//! # let _ = code; Ok(()) }
//! ```

mod cleanup;
mod client;
mod containers;
mod error;
mod exec;
mod images;
mod networks;
mod stream;
mod system;
mod transport;
mod volumes;

pub use cleanup::CleanupReport;
pub use client::{ApiVersion, Docker, MAX_API_VERSION};
pub use containers::{
    AttachOptions, ContainerConfigView, ContainerInspect, ContainerSpec, ContainerState,
    ContainerSummary, CreatedContainer, EndpointView, HostConfigView, LogsOptions, NetworkSettings,
    WaitCondition,
};
pub use error::{Error, Result};
pub use exec::{ExecInspect, ExecOutput, ExecSpec};
pub use images::{
    ErrorDetail, ImageConfig, ImageInspect, ImageSummary, ImportOptions, ProgressDetail,
    ProgressMessage, ProgressStream, split_reference,
};
pub use networks::{CreatedNetwork, NetworkInfo, NetworkSpec};
pub use stream::{AttachInput, Attached, CollectedOutput, JsonStream, LogOutput, LogStream};
pub use system::SystemVersion;
pub use transport::{
    BoxStream, ChildStream, CommandDialer, DEFAULT_SOCKET, Dialer, EngineStream, FnDialer,
    Prefetch, Transport, UnixDialer,
};
pub use volumes::{VolumeInfo, VolumeSpec};
