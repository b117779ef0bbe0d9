//! Plugin side: turn one [`ExecutorProvider`] into a go-plugin-shaped plugin binary.
//!
//! ```no_run
//! use slipway_executor_plugin::ExecutorProvider;
//!
//! fn plugin_main<P: ExecutorProvider>(provider: P) -> std::process::ExitCode {
//!     slipway_executor_plugin::sdk::run_plugin(provider)
//! }
//! ```

use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context, Poll};

use slipway_goplugin::process::MAX_MESSAGE_SIZE;
use slipway_goplugin::server::AddService;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::PROTOCOL;
use crate::convert::{caps_to_pb, error_to_status, exit_to_pb, prepared_to_pb};
use crate::proto::v1 as pb;
use crate::proto::v1::executor_server::{Executor as ExecutorRpc, ExecutorServer};
use crate::provider::{Chunk, ExecutorProvider, PrepareJob, Stage};

pub use slipway_goplugin::server::{ServeError, log};

/// Build a runtime, [`serve`] `provider`, and map the outcome to an exit code.
pub fn run_plugin<P: ExecutorProvider>(provider: P) -> ExitCode {
    slipway_goplugin::server::run(PROTOCOL, service(provider))
}

/// Serve `provider` until the host calls `GRPCController.Shutdown` or SIGTERM/SIGINT.
pub async fn serve<P: ExecutorProvider>(provider: P) -> Result<(), ServeError> {
    slipway_goplugin::server::serve(PROTOCOL, service(provider)).await
}

fn service<P: ExecutorProvider>(provider: P) -> impl AddService {
    move |router: tonic::transport::server::Router| {
        router.add_service(
            ExecutorServer::new(Service(Arc::new(provider)))
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
    }
}

/// Adapter from the Rust trait to the generated gRPC service.
struct Service<P>(Arc<P>);

/// The stream of one `Run`: when the host cancels the call, tonic drops it, and dropping it
/// aborts the task running the stage (and so drops the provider's `run` future).
struct RunStream {
    rx: ReceiverStream<Result<pb::RunOutput, Status>>,
    task: JoinHandle<()>,
}

impl Stream for RunStream {
    type Item = Result<pb::RunOutput, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.rx).poll_next(cx)
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn chunk_to_pb(c: Chunk) -> pb::RunOutput {
    pb::RunOutput {
        output: Some(match c {
            Chunk::Stdout(b) => pb::run_output::Output::Stdout(b),
            Chunk::Stderr(b) => pb::run_output::Output::Stderr(b),
        }),
    }
}

#[tonic::async_trait]
impl<P: ExecutorProvider> ExecutorRpc for Service<P> {
    async fn init(
        &self,
        req: Request<pb::InitRequest>,
    ) -> Result<Response<pb::InitResponse>, Status> {
        let req = req.into_inner();
        let caps = self
            .0
            .init(&req.config, req.dry_run)
            .await
            .map_err(error_to_status)?;
        Ok(Response::new(caps_to_pb(caps)))
    }

    async fn prepare(
        &self,
        req: Request<pb::PrepareRequest>,
    ) -> Result<Response<pb::PrepareResponse>, Status> {
        let req = req.into_inner();
        let job = PrepareJob {
            job: req.job,
            isolation: req.isolation,
            resources: req.resources.unwrap_or_default(),
            instance: req.instance,
            timeout: std::time::Duration::from_secs(req.timeout_secs),
        };
        let prepared = self.0.prepare(job).await.map_err(error_to_status)?;
        Ok(Response::new(prepared_to_pb(prepared)))
    }

    type RunStream = RunStream;

    async fn run(&self, req: Request<pb::RunRequest>) -> Result<Response<Self::RunStream>, Status> {
        let req = req.into_inner();
        let stage = Stage {
            state: req.state,
            name: req.stage,
            script: req.script,
            stdin: req.stdin,
        };
        let (tx, rx) = mpsc::channel(64);
        let provider = self.0.clone();
        let task = tokio::spawn(async move {
            let (chunk_tx, mut chunks) = mpsc::channel(64);
            let run = provider.run(stage, chunk_tx);
            tokio::pin!(run);
            let result = loop {
                tokio::select! {
                    Some(c) = chunks.recv() => {
                        if tx.send(Ok(chunk_to_pb(c))).await.is_err() {
                            return;
                        }
                    }
                    r = &mut run => break r,
                }
            };
            while let Ok(c) = chunks.try_recv() {
                if tx.send(Ok(chunk_to_pb(c))).await.is_err() {
                    return;
                }
            }
            let last = match result {
                Ok(exit) => Ok(pb::RunOutput {
                    output: Some(pb::run_output::Output::Exit(exit_to_pb(exit))),
                }),
                Err(e) => Err(error_to_status(e)),
            };
            let _ = tx.send(last).await;
        });
        Ok(Response::new(RunStream {
            rx: ReceiverStream::new(rx),
            task,
        }))
    }

    async fn cleanup(
        &self,
        req: Request<pb::CleanupRequest>,
    ) -> Result<Response<pb::CleanupResponse>, Status> {
        self.0
            .cleanup(&req.into_inner().state)
            .await
            .map_err(error_to_status)?;
        Ok(Response::new(pb::CleanupResponse {}))
    }
}
