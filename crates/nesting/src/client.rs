//! The manager's side of `nesting.v1`: a client over any byte stream (a local unix socket, or
//! a unix socket on an instance forwarded through its SSH connection), with GitLab's
//! create-then-init retry.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use crate::proto::{self, nesting_client};

/// A failed nesting call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon could not be reached.
    #[error("cannot reach the nesting daemon at {target}: {message}")]
    Connect {
        /// Where it was looked for.
        target: String,
        /// Why not.
        message: String,
    },
    /// The daemon answered with an error.
    #[error("nesting {op} failed: {message}")]
    Status {
        /// The call.
        op: &'static str,
        /// gRPC code.
        code: Code,
        /// The daemon's message.
        message: String,
    },
    /// The daemon answered without the VM or snapshot it should carry.
    #[error("nesting {0} answered without a result")]
    Empty(&'static str),
}

impl ClientError {
    /// The daemon does not know the VM or snapshot.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ClientError::Status {
                code: Code::NotFound,
                ..
            }
        )
    }

    /// The request itself is wrong for this daemon (no such image or snapshot, a bad name, a
    /// snapshot taken on another hypervisor build): a configuration problem, not a system one.
    pub fn is_configuration(&self) -> bool {
        match self {
            ClientError::Status { code, message, .. } => match code {
                Code::NotFound | Code::InvalidArgument => true,
                Code::FailedPrecondition => {
                    message.contains("cannot be restored on this host")
                        || message.contains("has been rebuilt since")
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// The call may have reached the daemon and gone on there without an answer reaching us
    /// (the connection broke): what it started may exist.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ClientError::Status {
                code: Code::Unavailable | Code::Unknown | Code::Cancelled,
                ..
            }
        )
    }

    fn status(op: &'static str) -> impl FnOnce(Status) -> ClientError {
        move |s| ClientError::Status {
            op,
            code: s.code(),
            message: s.message().to_string(),
        }
    }

    fn is(&self, code: Code, message: &str) -> bool {
        matches!(self, ClientError::Status { code: c, message: m, .. } if *c == code && m == message)
    }
}

/// A client of one nesting daemon.
#[derive(Debug, Clone)]
pub struct NestingClient {
    inner: nesting_client::NestingClient<Channel>,
}

impl NestingClient {
    /// Connect to a daemon's unix socket on this machine.
    pub async fn connect_unix(path: impl Into<PathBuf>) -> Result<NestingClient, ClientError> {
        let path = path.into();
        let target = path.display().to_string();
        Self::connect_with(target, move || {
            let path = path.clone();
            async move { tokio::net::UnixStream::connect(path).await }
        })
        .await
    }

    /// Connect through `open`, which makes a new byte stream to the daemon each time the
    /// channel needs a connection (an SSH unix-socket forward, say). `target` names it in
    /// errors.
    pub async fn connect_with<F, Fut, S>(
        target: impl Into<String>,
        open: F,
    ) -> Result<NestingClient, ClientError>
    where
        F: Fn() -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = std::io::Result<S>> + Send + 'static,
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let target = target.into();
        let connector = tower::service_fn(move |_: Uri| {
            let open = open.clone();
            async move { open().await.map(TokioIo::new) }
        });
        let channel = Endpoint::from_static("http://nesting.invalid")
            .connect_with_connector(connector)
            .await
            .map_err(|e| ClientError::Connect {
                target,
                message: error_chain(&e),
            })?;
        Ok(NestingClient {
            inner: nesting_client::NestingClient::new(channel),
        })
    }

    /// `Init` with the JSON configuration.
    pub async fn init(&mut self, config: &[u8]) -> Result<(), ClientError> {
        self.inner
            .init(proto::InitRequest {
                config: config.to_vec(),
            })
            .await
            .map_err(ClientError::status("init"))?;
        Ok(())
    }

    /// `Init`, where "already initialized" is success (GitLab's runner does the same).
    async fn ensure_init(&mut self, config: &[u8]) -> Result<(), ClientError> {
        match self.init(config).await {
            Err(e) if e.is(Code::FailedPrecondition, "already initialized") => Ok(()),
            other => other,
        }
    }

    /// `Create`: the VM and the id of a VM stomped in its slot.
    pub async fn create(
        &mut self,
        image: &str,
        slot: Option<i32>,
    ) -> Result<(proto::VirtualMachine, Option<String>), ClientError> {
        let r = self
            .inner
            .create(proto::CreateRequest {
                image: image.to_string(),
                slot,
            })
            .await
            .map_err(ClientError::status("create"))?
            .into_inner();
        Ok((r.vm.ok_or(ClientError::Empty("create"))?, r.stomped_vm_id))
    }

    /// `Create`, initialising the daemon with `config` first if it says it is not.
    pub async fn create_initialized(
        &mut self,
        image: &str,
        slot: Option<i32>,
        config: &[u8],
    ) -> Result<(proto::VirtualMachine, Option<String>), ClientError> {
        match self.create(image, slot).await {
            Err(e) if e.is(Code::FailedPrecondition, "not initialized") => {
                self.ensure_init(config).await?;
                self.create(image, slot).await
            }
            other => other,
        }
    }

    /// `Restore`: the VM and the id of a VM stomped in its slot.
    pub async fn restore(
        &mut self,
        snapshot: &str,
        slot: Option<i32>,
    ) -> Result<(proto::VirtualMachine, Option<String>), ClientError> {
        let r = self
            .inner
            .restore(proto::RestoreRequest {
                snapshot: snapshot.to_string(),
                slot,
            })
            .await
            .map_err(ClientError::status("restore"))?
            .into_inner();
        Ok((r.vm.ok_or(ClientError::Empty("restore"))?, r.stomped_vm_id))
    }

    /// `Restore`, initialising the daemon first if it says it is not.
    pub async fn restore_initialized(
        &mut self,
        snapshot: &str,
        slot: Option<i32>,
        config: &[u8],
    ) -> Result<(proto::VirtualMachine, Option<String>), ClientError> {
        match self.restore(snapshot, slot).await {
            Err(e) if e.is(Code::FailedPrecondition, "not initialized") => {
                self.ensure_init(config).await?;
                self.restore(snapshot, slot).await
            }
            other => other,
        }
    }

    /// `Snapshot` (the VM stops); the snapshot and the names retention removed.
    pub async fn snapshot(
        &mut self,
        vm: &str,
        name: &str,
        labels: HashMap<String, String>,
    ) -> Result<(proto::Snapshot, Vec<String>), ClientError> {
        let r = self
            .inner
            .snapshot(proto::SnapshotRequest {
                vm: vm.to_string(),
                name: name.to_string(),
                labels,
            })
            .await
            .map_err(ClientError::status("snapshot"))?
            .into_inner();
        Ok((r.snapshot.ok_or(ClientError::Empty("snapshot"))?, r.expired))
    }

    /// `Snapshot`, initialising the daemon first if it says it is not (a daemon restarted
    /// while the VM ran).
    pub async fn snapshot_initialized(
        &mut self,
        vm: &str,
        name: &str,
        labels: HashMap<String, String>,
        config: &[u8],
    ) -> Result<(proto::Snapshot, Vec<String>), ClientError> {
        match self.snapshot(vm, name, labels.clone()).await {
            Err(e) if e.is(Code::FailedPrecondition, "not initialized") => {
                self.ensure_init(config).await?;
                self.snapshot(vm, name, labels).await
            }
            other => other,
        }
    }

    /// `Delete`.
    pub async fn delete(&mut self, id: &str) -> Result<(), ClientError> {
        self.inner
            .delete(proto::DeleteRequest { id: id.to_string() })
            .await
            .map_err(ClientError::status("delete"))?;
        Ok(())
    }

    /// `List`.
    pub async fn list(&mut self) -> Result<Vec<proto::VirtualMachine>, ClientError> {
        Ok(self
            .inner
            .list(proto::ListRequest {})
            .await
            .map_err(ClientError::status("list"))?
            .into_inner()
            .vms)
    }

    /// `Shutdown`.
    pub async fn shutdown(&mut self) -> Result<(), ClientError> {
        self.inner
            .shutdown(proto::ShutdownRequest {})
            .await
            .map_err(ClientError::status("shutdown"))?;
        Ok(())
    }

    /// `ListSnapshots`.
    pub async fn list_snapshots(&mut self) -> Result<Vec<proto::Snapshot>, ClientError> {
        Ok(self
            .inner
            .list_snapshots(proto::ListSnapshotsRequest {})
            .await
            .map_err(ClientError::status("list-snapshots"))?
            .into_inner()
            .snapshots)
    }

    /// `DeleteSnapshot`.
    pub async fn delete_snapshot(&mut self, name: &str) -> Result<(), ClientError> {
        self.inner
            .delete_snapshot(proto::DeleteSnapshotRequest {
                name: name.to_string(),
            })
            .await
            .map_err(ClientError::status("delete-snapshot"))?;
        Ok(())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Where a VM's agent is, parsed from a VM's `addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentAddr {
    /// `unix:///path`: a virtio-serial port's socket on the instance.
    Unix(String),
    /// `vsock://PORT@/path`: a hybrid-vsock socket and the guest port.
    Vsock {
        /// Guest port.
        port: u32,
        /// Host socket.
        socket: String,
    },
}

impl AgentAddr {
    /// Parse an address; `None` if it is neither form.
    pub fn parse(addr: &str) -> Option<AgentAddr> {
        if let Some(path) = addr.strip_prefix("unix://") {
            return Some(AgentAddr::Unix(path.to_string()));
        }
        let rest = addr.strip_prefix("vsock://")?;
        let (port, socket) = rest.split_once('@')?;
        Some(AgentAddr::Vsock {
            port: port.parse().ok()?,
            socket: socket.to_string(),
        })
    }

    /// The unix socket on the instance.
    pub fn socket(&self) -> &str {
        match self {
            AgentAddr::Unix(s) | AgentAddr::Vsock { socket: s, .. } => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_addresses_parse() {
        assert_eq!(
            AgentAddr::parse("unix:///run/vms/1/agent.sock"),
            Some(AgentAddr::Unix("/run/vms/1/agent.sock".into()))
        );
        assert_eq!(
            AgentAddr::parse("vsock://1024@/run/vms/1/vsock.sock"),
            Some(AgentAddr::Vsock {
                port: 1024,
                socket: "/run/vms/1/vsock.sock".into()
            })
        );
        assert_eq!(AgentAddr::parse("tcp://1.2.3.4:22"), None);
    }
}
