//! Plugin side: turn one [`InstanceGroup`] implementation into a go-plugin-shaped plugin binary.
//!
//! A plugin's `main` is one call:
//!
//! ```no_run
//! use slipway_fleeting::InstanceGroup;
//!
//! fn plugin_main<G: InstanceGroup>(my_group: G) -> std::process::ExitCode {
//!     slipway_fleeting::sdk::run_plugin(my_group)
//! }
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use slipway_goplugin::process::MAX_MESSAGE_SIZE;
use tonic::{Request, Response, Status};

use crate::convert::{
    connect_info_to_pb, connector_from_pb, error_to_status, info_to_pb, state_to_pb,
};
use crate::group::InstanceGroup;
use crate::proto::fleeting::v1 as pb;
use crate::proto::fleeting::v1::instance_group_server::{
    InstanceGroup as InstanceGroupRpc, InstanceGroupServer,
};

pub use slipway_goplugin::server::{ServeError as SdkError, log};
pub use slipway_goplugin::{ENV_CLIENT_CERT, ENV_PROTOCOL_VERSIONS, ENV_UNIX_SOCKET_DIR};

/// Build a multi-thread runtime, [`serve`] `group`, and map the outcome to an exit code.
pub fn run_plugin<G: InstanceGroup>(group: G) -> ExitCode {
    slipway_goplugin::server::run(crate::PROTOCOL, service(group))
}

/// Serve `group` as a plugin until the host calls `GRPCController.Shutdown` or SIGTERM/SIGINT.
pub async fn serve<G: InstanceGroup>(group: G) -> Result<(), SdkError> {
    slipway_goplugin::server::serve(crate::PROTOCOL, service(group)).await
}

fn service<G: InstanceGroup>(group: G) -> impl slipway_goplugin::server::AddService {
    move |router: tonic::transport::server::Router| {
        router.add_service(
            InstanceGroupServer::new(GroupService(Arc::new(group)))
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
    }
}

/// Adapter from the Rust trait to the generated gRPC service.
struct GroupService<G>(Arc<G>);

#[tonic::async_trait]
impl<G: InstanceGroup> InstanceGroupRpc for GroupService<G> {
    async fn init(
        &self,
        req: Request<pb::InitRequest>,
    ) -> Result<Response<pb::InitResponse>, Status> {
        let req = req.into_inner();
        let connector = connector_from_pb(req.connector.unwrap_or_default())
            .map_err(Status::invalid_argument)?;
        let info = self
            .0
            .init(&req.plugin_config, &connector)
            .await
            .map_err(error_to_status)?;
        Ok(Response::new(pb::InitResponse {
            info: Some(info_to_pb(info)),
        }))
    }

    async fn update(
        &self,
        _: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let instances = self
            .0
            .update()
            .await
            .map_err(error_to_status)?
            .into_iter()
            .map(|(id, s)| pb::Instance {
                id,
                state: state_to_pb(s).into(),
            })
            .collect();
        Ok(Response::new(pb::UpdateResponse { instances }))
    }

    async fn increase(
        &self,
        req: Request<pb::IncreaseRequest>,
    ) -> Result<Response<pb::IncreaseResponse>, Status> {
        let succeeded = self
            .0
            .increase(req.into_inner().delta)
            .await
            .map_err(error_to_status)?;
        Ok(Response::new(pb::IncreaseResponse { succeeded }))
    }

    async fn decrease(
        &self,
        req: Request<pb::DecreaseRequest>,
    ) -> Result<Response<pb::DecreaseResponse>, Status> {
        let succeeded = self
            .0
            .decrease(&req.into_inner().ids)
            .await
            .map_err(error_to_status)?;
        Ok(Response::new(pb::DecreaseResponse { succeeded }))
    }

    async fn connect_info(
        &self,
        req: Request<pb::ConnectInfoRequest>,
    ) -> Result<Response<pb::ConnectInfoResponse>, Status> {
        let info = self
            .0
            .connect_info(&req.into_inner().id)
            .await
            .map_err(error_to_status)?;
        Ok(Response::new(connect_info_to_pb(info)))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        self.0
            .heartbeat(&req.into_inner().id)
            .await
            .map_err(error_to_status)?;
        Ok(Response::new(pb::HeartbeatResponse {}))
    }

    async fn shutdown(
        &self,
        _: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        self.0.shutdown().await.map_err(error_to_status)?;
        Ok(Response::new(pb::ShutdownResponse {}))
    }
}
