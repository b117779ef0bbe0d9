//! Plugin side: print go-plugin's handshake and serve a gRPC service (plus go-plugin's health,
//! controller, stdio and broker services) until the host says stop.
//!
//! A plugin SDK's entry point is one call: [`run`] with its [`Protocol`] and a closure adding
//! its service to the router.

use std::fmt::Display;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::AsyncWriteExt as _;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::{ReceiverStream, WatchStream};
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status, Streaming};
use tracing::Level;

use tonic::transport::server::Router;

use crate::handshake::{Handshake, Network};
use crate::io::ServerIo;
use crate::proto::grpc_broker_server::{GrpcBroker, GrpcBrokerServer};
use crate::proto::grpc_controller_server::{GrpcController, GrpcControllerServer};
use crate::proto::grpc_stdio_server::{GrpcStdio, GrpcStdioServer};
use crate::proto::{ConnInfo, Empty, StdioData};
use crate::tls::{self, AutoMtlsCert, TlsError};
use crate::{ENV_CLIENT_CERT, ENV_PROTOCOL_VERSIONS, ENV_UNIX_SOCKET_DIR, Protocol};

/// Grace period for in-flight RPCs once shutdown was requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// A host that cannot finish a TLS handshake in this time is dropped.
const TLS_ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Why a plugin could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Started by hand instead of by the manager.
    #[error(
        "this program is {} and is not meant to be run directly: the Slipway manager starts it \
         when it is configured ({} is not set to the expected value)",
        .0.what,
        .0.cookie_key
    )]
    NotStartedByManager(Protocol),
    /// AutoMTLS setup failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A filesystem or socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
    let what = what.into();
    move |source| ServeError::Io { what, source }
}

/// Adds the plugin's own service to the router that already serves go-plugin's.
pub trait AddService: FnOnce(Router) -> Router + Send {}
impl<F: FnOnce(Router) -> Router + Send> AddService for F {}

/// Build a multi-thread runtime, [`serve`], and map the outcome to an exit code.
pub fn run(protocol: Protocol, add: impl AddService) -> ExitCode {
    run_on(tokio::runtime::Builder::new_multi_thread(), protocol, add)
}

/// [`run`] on a single-threaded runtime: for a plugin that mostly waits on processes and
/// sockets, one thread saves a cross-thread wakeup per message it streams.
pub fn run_single_threaded(protocol: Protocol, add: impl AddService) -> ExitCode {
    run_on(tokio::runtime::Builder::new_current_thread(), protocol, add)
}

fn run_on(
    mut builder: tokio::runtime::Builder,
    protocol: Protocol,
    add: impl AddService,
) -> ExitCode {
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            log(
                Level::ERROR,
                "cannot start the tokio runtime",
                &[("error", &e)],
            );
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(serve(protocol, add));
    rt.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ ServeError::NotStartedByManager(_)) => {
            // A human ran the binary: plain text, not JSON.
            eprintln!("{e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            log(Level::ERROR, "plugin failed", &[("error", &e)]);
            ExitCode::FAILURE
        }
    }
}

/// Serve until the host calls `GRPCController.Shutdown` or SIGTERM/SIGINT arrives.
pub async fn serve(protocol: Protocol, add: impl AddService) -> Result<(), ServeError> {
    if std::env::var(protocol.cookie_key).ok().as_deref() != Some(protocol.cookie_value) {
        return Err(ServeError::NotStartedByManager(protocol));
    }
    let app_version = negotiate_version(
        std::env::var(ENV_PROTOCOL_VERSIONS)
            .unwrap_or_default()
            .as_str(),
        protocol.versions,
    );

    // AutoMTLS only when the host sent its certificate, as go-plugin does.
    let (tls, server_cert) = match std::env::var(ENV_CLIENT_CERT) {
        Ok(pem) if !pem.trim().is_empty() => {
            let client_cert = tls::cert_from_pem(&pem)?;
            let own = AutoMtlsCert::generate()?;
            let cfg = tls::server_config(&own, client_cert)?;
            (
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(cfg))),
                Some(own.cert_der.to_vec()),
            )
        }
        _ => (None, None),
    };

    let (socket_dir, own_dir) = match std::env::var_os(ENV_UNIX_SOCKET_DIR) {
        Some(d) if !d.is_empty() => (PathBuf::from(d), false),
        _ => (
            crate::io::make_private_dir("slipway-plugin")
                .await
                .map_err(io_err("creating the socket directory"))?,
            true,
        ),
    };
    let socket = socket_dir.join(format!("plugin{:08x}", rand::random::<u32>()));
    let listener = UnixListener::bind(&socket)
        .map_err(io_err(format!("listening on {}", socket.display())))?;
    // Owner only, set before the socket is announced; its directory is private already
    // (ours, or the host's), so nobody else could reach it in between.
    {
        use std::os::unix::fs::PermissionsExt as _;
        tokio::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .await
            .map_err(io_err(format!("restricting {}", socket.display())))?;
    }

    let result = serve_on(add, listener, tls, &socket, app_version, server_cert).await;

    // Best effort: a stale socket file is harmless but untidy.
    let _ = tokio::fs::remove_file(&socket).await;
    if own_dir {
        let _ = tokio::fs::remove_dir(&socket_dir).await;
    }
    result
}

async fn serve_on(
    add: impl AddService,
    listener: UnixListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    socket: &Path,
    app_version: u32,
    server_cert: Option<Vec<u8>>,
) -> Result<(), ServeError> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown_tx = Arc::new(shutdown_tx);

    let (health, health_svc) = tonic_health::server::health_reporter();
    health
        .set_service_status("plugin", tonic_health::ServingStatus::Serving)
        .await;

    let (conn_tx, conn_rx) = mpsc::channel::<Result<ServerIo, std::io::Error>>(8);
    // Owned here: aborted (with its handshake tasks) when this function returns.
    let mut acceptor = JoinSet::new();
    acceptor.spawn(accept_loop(listener, tls, conn_tx));

    let mut stop = shutdown_rx.clone();
    let router = tonic::transport::Server::builder()
        .add_service(health_svc)
        .add_service(GrpcControllerServer::new(Controller(shutdown_tx.clone())))
        .add_service(GrpcStdioServer::new(Stdio(shutdown_rx.clone())))
        .add_service(GrpcBrokerServer::new(Broker(shutdown_rx.clone())));
    let server =
        add(router).serve_with_incoming_shutdown(ReceiverStream::new(conn_rx), async move {
            let _ = stop.wait_for(|s| *s).await;
        });
    tokio::pin!(server);

    let line = Handshake {
        app_version,
        network: Network::Unix,
        address: socket.display().to_string(),
        server_cert,
        multiplex: false,
    }
    .format();
    let mut stdout = tokio::io::stdout();
    stdout
        .write_all(format!("{line}\n").as_bytes())
        .await
        .map_err(io_err("printing the handshake"))?;
    stdout
        .flush()
        .await
        .map_err(io_err("printing the handshake"))?;

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(io_err("installing the SIGTERM handler"))?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(io_err("installing the SIGINT handler"))?;
    let mut requested = shutdown_rx.clone();

    let result = tokio::select! {
        r = &mut server => r,
        _ = requested.wait_for(|s| *s) => drain(&mut server).await,
        _ = sigterm.recv() => {
            let _ = shutdown_tx.send(true);
            drain(&mut server).await
        }
        _ = sigint.recv() => {
            let _ = shutdown_tx.send(true);
            drain(&mut server).await
        }
    };
    acceptor.shutdown().await;
    Ok(result?)
}

/// Give in-flight RPCs (the Shutdown reply included) a moment to finish.
async fn drain<F>(server: &mut Pin<&mut F>) -> Result<(), tonic::transport::Error>
where
    F: Future<Output = Result<(), tonic::transport::Error>>,
{
    match tokio::time::timeout(SHUTDOWN_GRACE, server.as_mut()).await {
        Ok(r) => r,
        Err(_) => {
            log(
                Level::WARN,
                "connections did not close in time; exiting anyway",
                &[],
            );
            Ok(())
        }
    }
}

/// Pick the highest version both sides speak; otherwise our own highest (the host then refuses).
fn negotiate_version(host_versions: &str, ours: &[u32]) -> u32 {
    let host: Vec<u32> = host_versions
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let mut ours = ours.to_vec();
    ours.sort_unstable_by(|a, b| b.cmp(a));
    ours.iter()
        .copied()
        .find(|v| host.contains(v))
        .or(ours.first().copied())
        .unwrap_or(1)
}

async fn accept_loop(
    listener: UnixListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    out: mpsc::Sender<Result<ServerIo, std::io::Error>>,
) {
    // TLS handshakes run concurrently so one stuck peer cannot block the next connection.
    let mut handshakes = JoinSet::new();
    loop {
        while handshakes.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                log(Level::WARN, "accept failed", &[("error", &e)]);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match &tls {
            None => {
                if out.send(Ok(ServerIo(Box::new(stream)))).await.is_err() {
                    return;
                }
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let out = out.clone();
                handshakes.spawn(async move {
                    match tokio::time::timeout(TLS_ACCEPT_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let _ = out.send(Ok(ServerIo(Box::new(s)))).await;
                        }
                        Ok(Err(e)) => log(
                            Level::WARN,
                            "TLS handshake with the host failed",
                            &[("error", &e)],
                        ),
                        Err(_) => log(Level::WARN, "TLS handshake with the host timed out", &[]),
                    }
                });
            }
        }
    }
}

/// `plugin.GRPCController`: Shutdown stops the process.
struct Controller(Arc<watch::Sender<bool>>);

#[tonic::async_trait]
impl GrpcController for Controller {
    async fn shutdown(&self, _: Request<Empty>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(true);
        Ok(Response::new(Empty {}))
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A stream that sends nothing and ends at shutdown, so graceful shutdown is not held up by it.
fn idle_until_shutdown<T: Send + 'static>(shutdown: &watch::Receiver<bool>) -> BoxStream<T> {
    Box::pin(
        WatchStream::new(shutdown.clone())
            .take_while(|s| !*s)
            .filter_map(|_| None),
    )
}

/// `plugin.GRPCStdio`: this SDK logs to stderr directly, so the stream stays idle.
struct Stdio(watch::Receiver<bool>);

#[tonic::async_trait]
impl GrpcStdio for Stdio {
    type StreamStdioStream = BoxStream<StdioData>;

    async fn stream_stdio(
        &self,
        _: Request<()>,
    ) -> Result<Response<Self::StreamStdioStream>, Status> {
        Ok(Response::new(idle_until_shutdown(&self.0)))
    }
}

/// `plugin.GRPCBroker`: a stub, this SDK exposes no extra servers.
struct Broker(watch::Receiver<bool>);

#[tonic::async_trait]
impl GrpcBroker for Broker {
    type StartStreamStream = BoxStream<ConnInfo>;

    async fn start_stream(
        &self,
        _: Request<Streaming<ConnInfo>>,
    ) -> Result<Response<Self::StartStreamStream>, Status> {
        Ok(Response::new(idle_until_shutdown(&self.0)))
    }
}

/// Write one hclog-style JSON line (`@level`, `@message`, `@timestamp`, fields) to stderr, which
/// the host re-emits as a tracing event. Never pass secrets as fields.
pub fn log(level: Level, message: &str, fields: &[(&str, &dyn Display)]) {
    let mut obj = serde_json::Map::new();
    obj.insert("@level".into(), level.as_str().to_ascii_lowercase().into());
    obj.insert("@message".into(), message.into());
    obj.insert("@timestamp".into(), rfc3339_now().into());
    for (k, v) in fields {
        obj.insert((*k).to_owned(), v.to_string().into());
    }
    let mut line = serde_json::Value::Object(obj).to_string();
    line.push('\n');
    // One small write per line; stderr is unbuffered, so lines from threads do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// UTC time as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (what hclog writes), without a date crate.
fn rfc3339_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiates_highest_shared_version() {
        assert_eq!(negotiate_version("1", &[1]), 1);
        assert_eq!(negotiate_version("1,2", &[1]), 1);
        assert_eq!(negotiate_version("1,2", &[1, 2]), 2);
        assert_eq!(negotiate_version("", &[1]), 1);
        assert_eq!(negotiate_version("x, 1", &[1, 2]), 1);
    }

    #[test]
    fn timestamp_shape() {
        let t = rfc3339_now();
        assert_eq!(t.len(), 27, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    }
}
