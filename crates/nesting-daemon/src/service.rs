//! The gRPC face of a [`Daemon`]: each `nesting.v1` call mapped onto the daemon, run to its
//! end even when the caller goes away, and the warm slots told when a slot frees up.

use std::sync::Arc;

use slipway_nesting::proto::{self, nesting_server};
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
