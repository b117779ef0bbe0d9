//! Plugin side: turn one [`ExecutorProvider`] into a go-plugin-shaped plugin binary.
//!
//! ```no_run
//! use slipway_executor_plugin::ExecutorProvider;
//!
//! fn plugin_main<P: ExecutorProvider>(provider: P) -> std::process::ExitCode {
//!     slipway_executor_plugin::sdk::run_plugin(provider)
//! }
//! ```

use std::future::Future as _;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context, Poll};

use slipway_goplugin::process::MAX_MESSAGE_SIZE;
use slipway_goplugin::server::AddService;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::PROTOCOL;
use crate::convert::{caps_to_pb, error_to_status, exit_to_pb, prepared_to_pb};
use crate::proto::v1 as pb;
use crate::proto::v1::executor_server::{Executor as ExecutorRpc, ExecutorServer};
use crate::provider::{
    Chunk, CleanupJob, ExecutorProvider, Exit, JobStatus, PrepareJob, ProviderError, Stage,
};

pub use slipway_goplugin::server::{ServeError, log};

/// Build a runtime, [`serve`] `provider`, and map the outcome to an exit code. The runtime has
/// one thread: a provider waits on processes and sockets, and a job's output streams with fewer
/// wakeups (spawn CPU-heavy work with `spawn_blocking`).
pub fn run_plugin<P: ExecutorProvider>(provider: P) -> ExitCode {
    slipway_goplugin::server::run_single_threaded(PROTOCOL, service(provider))
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

/// The stream of one `Run`: the stage's chunks as they come, then its exit. When the host
/// cancels the call, tonic drops the stream, and dropping it aborts the task running the stage
/// (and so drops the provider's `run` future).
struct RunStream {
    chunks: mpsc::Receiver<Chunk>,
    /// Output gathered for the next message.
    pending: Option<Chunk>,
    /// A chunk of the other stream met while gathering, sent next.
    held: Option<Chunk>,
    /// How long a partial message waits for more output.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The provider's sender is gone: its `run` returned.
    ended: bool,
    /// When the last message went out: only output that flows fast is held back to gather.
    last_emit: Option<tokio::time::Instant>,
    /// The stage; taken once its exit was sent.
    task: Option<JoinHandle<Result<Exit, ProviderError>>>,
}

impl RunStream {
    fn emit(&mut self) -> Poll<Option<Result<pb::RunOutput, Status>>> {
        self.linger = None;
        self.last_emit = Some(tokio::time::Instant::now());
        let chunk = self.pending.take().or_else(|| self.held.take());
        Poll::Ready(chunk.map(|c| Ok(chunk_to_pb(c))))
    }
}

impl Stream for RunStream {
    type Item = Result<pb::RunOutput, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Gather output into messages of up to COALESCE_BYTES: a fast writer's many small pipe
        // reads cost one message, not one each. A partial message waits LINGER for more.
        loop {
            if self.pending.is_none() {
                self.pending = self.held.take();
            }
            if self.held.is_some()
                || self
                    .pending
                    .as_ref()
                    .is_some_and(|c| chunk_len(c) >= COALESCE_BYTES)
            {
                return self.emit();
            }
            if self.ended {
                break;
            }
            match self.chunks.poll_recv(cx) {
                Poll::Ready(Some(next)) => match (&mut self.pending, next) {
                    (None, next) => self.pending = Some(next),
                    (Some(Chunk::Stdout(a)), Chunk::Stdout(b))
                    | (Some(Chunk::Stderr(a)), Chunk::Stderr(b)) => a.extend_from_slice(&b),
                    (Some(_), other) => self.held = Some(other),
                },
                Poll::Ready(None) => self.ended = true,
                Poll::Pending => {
                    if self.pending.is_none() {
                        return Poll::Pending;
                    }
                    // A first line, or output after a pause, goes out at once.
                    let flowing = self.last_emit.is_some_and(|t| t.elapsed() < FLOWING);
                    if !flowing && self.linger.is_none() {
                        return self.emit();
                    }
                    let linger = self
                        .linger
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(LINGER)));
                    return match linger.as_mut().poll(cx) {
                        Poll::Ready(()) => self.emit(),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
        if self.pending.is_some() {
            return self.emit();
        }
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(None);
        };
        let result = match Pin::new(task).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        self.task = None;
        Poll::Ready(Some(match result {
            Ok(Ok(exit)) => Ok(pb::RunOutput {
                output: Some(pb::run_output::Output::Exit(exit_to_pb(exit))),
            }),
            Ok(Err(e)) => Err(error_to_status(e)),
            Err(e) => Err(Status::internal(format!("the stage's task failed: {e}"))),
        }))
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Largest message gathered from a stage's output chunks.
const COALESCE_BYTES: usize = 256 * 1024;
/// How long a partial message of fast-flowing output waits for more (a trace line shows at
/// most this much later).
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);
/// Output is flowing fast when a message went out less than this long ago.
const FLOWING: std::time::Duration = std::time::Duration::from_millis(5);

fn chunk_len(c: &Chunk) -> usize {
    match c {
        Chunk::Stdout(b) | Chunk::Stderr(b) => b.len(),
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
            instance: req.instance,
        };
        let (tx, chunks) = mpsc::channel(64);
        let provider = self.0.clone();
        let task = tokio::spawn(async move { provider.run(stage, tx).await });
        Ok(Response::new(RunStream {
            chunks,
            pending: None,
            held: None,
            linger: None,
            ended: false,
            last_emit: None,
            task: Some(task),
        }))
    }

    async fn cleanup(
        &self,
        req: Request<pb::CleanupRequest>,
    ) -> Result<Response<pb::CleanupResponse>, Status> {
        let req = req.into_inner();
        let messages = self
            .0
            .cleanup(CleanupJob {
                state: req.state,
                instance: req.instance,
                status: JobStatus::from_ci_name(&req.job_status),
            })
            .await
            .map_err(error_to_status)?;
        Ok(Response::new(pb::CleanupResponse { messages }))
    }
}
