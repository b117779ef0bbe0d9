//! The manager's HTTP endpoint: `/metrics` (Prometheus text) and `/healthz`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running HTTP server; stopped by [`Server::stop`].
#[derive(Debug)]
pub struct Server {
    /// The address it listens on (useful when port 0 was asked for).
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Server {
    /// Listen on `addr` and serve `registry`.
    pub async fn start(addr: &str, registry: Registry) -> anyhow::Result<Server> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listen_address {addr:?}: cannot listen"))?;
        let addr = listener.local_addr()?;
        let registry = Arc::new(registry);
        let app = Router::new()
            .route(
                "/metrics",
                get(move || {
                    let registry = registry.clone();
                    async move { metrics(&registry) }
                }),
            )
            .route("/healthz", get(|| async { "ok\n" }));
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "metrics server failed");
            }
        });
        tracing::info!(%addr, "serving /metrics");
        Ok(Server { addr, stop, task })
    }

    /// Stop serving and wait for the server task.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

fn metrics(registry: &Registry) -> axum::response::Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("encoding metrics: {e}\n"),
        )
            .into_response(),
    }
}
