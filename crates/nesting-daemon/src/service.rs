//! The gRPC face of a [`Daemon`]: each `nesting.v1` call mapped onto the daemon, run to its
//! end even when the caller goes away, and the warm slots told when a slot frees up.

use std::path::Path;
use std::sync::Arc;

use slipway_nesting::proto::{self, nesting_server};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::daemon::Daemon;
use crate::error::DaemonError;
use crate::snapshot::SnapshotMeta;
use crate::store;
use crate::store::VmRecord;

/// Run `work` to its end even if the caller goes away: a client that drops a call half-way
/// (a canceled job) must not leave a VM half-started, a slot marked busy or half a snapshot.
async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, DaemonError>> + Send + 'static,
) -> Result<T, Status> {
    match tokio::spawn(work).await {
        Ok(r) => r.map_err(Status::from),
        Err(e) => Err(Status::internal(format!("nesting request failed: {e}"))),
    }
}

/// The gRPC face of a [`Daemon`].
#[derive(Debug, Clone)]
pub struct Service(pub Arc<Daemon>);

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl nesting_server::Nesting for Service {
    async fn init(&self, r: Request<proto::InitRequest>) -> Reply<proto::InitResponse> {
        self.0.init(&r.into_inner().config).await?;
        Ok(Response::new(proto::InitResponse {}))
    }

    async fn create(&self, r: Request<proto::CreateRequest>) -> Reply<proto::CreateResponse> {
        let r = r.into_inner();
        let d = self.0.clone();
        let (vm, stomped, warm) = detached(async move { d.create(&r.image, r.slot).await }).await?;
        let mut vm = vm.to_proto();
        vm.warm = warm;
        Ok(Response::new(proto::CreateResponse {
            vm: Some(vm),
            stomped_vm_id: stomped,
        }))
    }

    async fn delete(&self, r: Request<proto::DeleteRequest>) -> Reply<proto::DeleteResponse> {
        let d = self.0.clone();
        let id = r.into_inner().id;
        detached(async move {
            // A job's VM gone: its slot gets its next warm VM (a warm VM deleted is not
            // replaced: whoever deleted it wants the slot empty).
            let gone = d.delete(&id).await?;
            if let (Some(slot), false) = (gone.slot, gone.warm) {
                d.fill(slot);
            }
            Ok(())
        })
        .await?;
        Ok(Response::new(proto::DeleteResponse {}))
    }

    async fn list(&self, _: Request<proto::ListRequest>) -> Reply<proto::ListResponse> {
        let vms = self.0.list().await.iter().map(VmRecord::to_proto).collect();
        Ok(Response::new(proto::ListResponse { vms }))
    }

    async fn shutdown(&self, _: Request<proto::ShutdownRequest>) -> Reply<proto::ShutdownResponse> {
        self.0.shutdown().await?;
        Ok(Response::new(proto::ShutdownResponse {}))
    }

    async fn snapshot(&self, r: Request<proto::SnapshotRequest>) -> Reply<proto::SnapshotResponse> {
        let r = r.into_inner();
        if crate::daemon::warm::is_base(&r.name) {
            return Err(Status::invalid_argument(format!(
                "snapshot name {:?}: names starting with {:?} are the daemon's (warm slots' base snapshots)",
                r.name,
                crate::daemon::warm::BASE_PREFIX
            )));
        }
        let d = self.0.clone();
        let (meta, expired) = detached(async move {
            let slot = store::load_all(&d.state_dir())
                .0
                .into_iter()
                .find(|v| v.id == r.vm)
                .and_then(|v| v.slot);
            let done = d
                .snapshot(&r.vm, &r.name, r.labels.into_iter().collect())
                .await?;
            // The snapshot consumed the slot's VM.
            if let Some(slot) = slot {
                d.fill(slot);
            }
            Ok(done)
        })
        .await?;
        Ok(Response::new(proto::SnapshotResponse {
            snapshot: Some(meta.to_proto()),
            expired,
        }))
    }

    async fn restore(&self, r: Request<proto::RestoreRequest>) -> Reply<proto::RestoreResponse> {
        let r = r.into_inner();
        let d = self.0.clone();
        let (vm, stomped) = detached(async move { d.restore(&r.snapshot, r.slot).await }).await?;
        Ok(Response::new(proto::RestoreResponse {
            vm: Some(vm.to_proto()),
            stomped_vm_id: stomped,
        }))
    }

    async fn list_snapshots(
        &self,
        _: Request<proto::ListSnapshotsRequest>,
    ) -> Reply<proto::ListSnapshotsResponse> {
        let snapshots = self
            .0
            .snapshots()
            .iter()
            .map(SnapshotMeta::to_proto)
            .collect();
        Ok(Response::new(proto::ListSnapshotsResponse { snapshots }))
    }

    async fn delete_snapshot(
        &self,
        r: Request<proto::DeleteSnapshotRequest>,
    ) -> Reply<proto::DeleteSnapshotResponse> {
        self.0.delete_snapshot(&r.into_inner().name).await?;
        Ok(Response::new(proto::DeleteSnapshotResponse {}))
    }
}

/// Serving: the daemon behind its gRPC face (here, so the daemon never imports its face).
impl Daemon {
    /// Serve `nesting.v1` on `socket` (mode 0600) until `stop` fires. VMs keep running when
    /// the daemon stops; `Shutdown` is what deletes them.
    pub async fn serve(
        self: Arc<Self>,
        socket: &Path,
        stop: CancellationToken,
    ) -> Result<(), DaemonError> {
        if socket.exists() {
            // A live daemon answers; a stale socket from a dead one is replaced.
            if tokio::net::UnixStream::connect(socket).await.is_ok() {
                return Err(DaemonError::Conflict(format!(
                    "another nesting daemon is listening on {}",
                    socket.display()
                )));
            }
            let _ = std::fs::remove_file(socket);
        }
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent)
                .map_err(DaemonError::io(format!("creating {}", parent.display())))?;
        }
        let listener = bind_private(socket).map_err(DaemonError::io(format!(
            "listening on {}",
            socket.display()
        )))?;
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let service = nesting_server::NestingServer::new(Service(self.clone()));
        let result = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, stop.cancelled())
            .await;
        let _ = std::fs::remove_file(socket);
        result.map_err(|e| DaemonError::Io {
            context: format!("serving on {}", socket.display()),
            source: std::io::Error::other(e),
        })
    }
}

/// Listen on `socket`, reachable by its owner only from the first moment: bound inside a fresh
/// 0700 directory beside it, made 0600 there, then renamed into place (a chmod after binding
/// would leave a moment in which anyone could connect under a lax umask).
fn bind_private(socket: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let parent = socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let private = parent.join(format!(".nesting-bind-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let staged = private.join("s");
    let bound = tokio::net::UnixListener::bind(&staged).and_then(|l| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staged, socket)?;
        Ok(l)
    });
    let _ = std::fs::remove_dir_all(&private);
    bound
}
