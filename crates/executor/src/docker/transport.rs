//! `docker-autoscaler`'s way to an instance's engine: `docker system dial-stdio` over SSH.

use std::sync::Arc;

use slipway_connector::Client;
use slipway_docker::{FnDialer, Prefetch, Transport};

use crate::script;

/// Connections to an instance's engine kept dialed ahead (see [`dial_stdio_transport`]).
pub const DIAL_STDIO_SPARES: usize = 2;

/// The engine of an instance through `docker system dial-stdio` on SSH channels of `client`
/// (one channel per HTTP connection): no TCP port and no socket file on either side. `host` is
/// `[runners.docker] host`, passed as `docker -H <host>` when set.
pub fn dial_stdio_transport(client: Arc<Client>, host: Option<&str>) -> Transport {
    let command = match host.filter(|h| !h.is_empty()) {
        Some(h) => format!("docker -H {} system dial-stdio", script::quote(h)),
        None => "docker system dial-stdio".to_string(),
    };
    let name = format!("ssh {} {command}", client.instance());
    let dialer = FnDialer::new(name, move || {
        let client = Arc::clone(&client);
        let command = command.clone();
        async move {
            client
                .open_stream(&command)
                .await
                .map_err(std::io::Error::other)
        }
    });
    // Each connection starts a `docker` process on the instance: keep two dialed ahead so a
    // job's first requests (and the attach that takes a connection for good) do not wait.
    Transport::dialer(Prefetch::new(dialer, DIAL_STDIO_SPARES))
}
