//! A fake fleeting plugin for the process-level fuzz target: the real go-plugin handshake and
//! gRPC server (`slipway_goplugin::server`), answering every call with a well-framed reply of
//! random content, or a random gRPC status, drawn from `SLIPWAY_FUZZ_PLUGIN_SEED`.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use slipway_fleeting::proto::fleeting::v1 as pb;
use slipway_fleeting::proto::fleeting::v1::instance_group_server::{
    InstanceGroup, InstanceGroupServer,
};
use tonic::{Code, Request, Response, Status};

struct Fuzzed(Mutex<StdRng>);

fn text(rng: &mut StdRng) -> String {
    const PARTS: &[&str] = &[
        "i-1",
        "",
        "127.0.0.1",
        "[::1]:22",
        "host:99999",
        "\u{0}",
        "é",
        "💥",
        "..",
        "/",
        "a b",
        "\n",
        "-1",
        "ssh",
        "winrm",
        "linux",
        "x",
    ];
    let n = rng.random_range(0..4);
    let mut s: String = (0..n)
        .map(|_| PARTS[rng.random_range(0..PARTS.len())])
        .collect();
    if rng.random_bool(0.05) {
        s.push_str(&"x".repeat(rng.random_range(0..100_000)));
    }
    s
}

impl Fuzzed {
    fn reply<T>(&self, make: impl FnOnce(&mut StdRng) -> T) -> Result<Response<T>, Status> {
        let mut rng = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if rng.random_bool(0.25) {
            let code = Code::from_i32(rng.random_range(0..20));
            let message = text(&mut rng);
            return Err(Status::new(code, message));
        }
        Ok(Response::new(make(&mut rng)))
    }
}

#[tonic::async_trait]
impl InstanceGroup for Fuzzed {
    async fn init(
        &self,
        _: Request<pb::InitRequest>,
    ) -> Result<Response<pb::InitResponse>, Status> {
        self.reply(|r| pb::InitResponse {
            info: r.random_bool(0.8).then(|| pb::ProviderInfo {
                id: text(r),
                max_size: r.random(),
                version: text(r),
                build_info: text(r),
                capabilities: (0..r.random_range(0..4)).map(|_| text(r)).collect(),
            }),
        })
    }

    async fn update(
        &self,
        _: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        self.reply(|r| pb::UpdateResponse {
            instances: (0..r.random_range(0..50))
                .map(|_| pb::Instance {
                    id: text(r),
                    state: r.random_range(-2..12),
                })
                .collect(),
        })
    }

    async fn increase(
        &self,
        _: Request<pb::IncreaseRequest>,
    ) -> Result<Response<pb::IncreaseResponse>, Status> {
        self.reply(|r| pb::IncreaseResponse {
            succeeded: r.random(),
        })
    }

    async fn decrease(
        &self,
        _: Request<pb::DecreaseRequest>,
    ) -> Result<Response<pb::DecreaseResponse>, Status> {
        self.reply(|r| pb::DecreaseResponse {
            succeeded: (0..r.random_range(0..8)).map(|_| text(r)).collect(),
        })
    }

    async fn connect_info(
        &self,
        _: Request<pb::ConnectInfoRequest>,
    ) -> Result<Response<pb::ConnectInfoResponse>, Status> {
        self.reply(|r| pb::ConnectInfoResponse {
            id: text(r),
            connector: r.random_bool(0.8).then(|| pb::ConnectorConfig {
                os: text(r),
                arch: text(r),
                protocol: text(r),
                protocol_port: if r.random_bool(0.5) { r.random() } else { 22 },
                username: text(r),
                password: text(r),
                key: text(r).into_bytes(),
                use_static_credentials: r.random(),
                keepalive_ms: r.random(),
                timeout_ms: r.random(),
            }),
            internal_addr: text(r),
            external_addr: text(r),
            expires_unix: r.random(),
        })
    }

    async fn heartbeat(
        &self,
        _: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        self.reply(|_| pb::HeartbeatResponse {})
    }

    async fn shutdown(
        &self,
        _: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        self.reply(|_| pb::ShutdownResponse {})
    }
}

fn main() -> std::process::ExitCode {
    let seed = std::env::var("SLIPWAY_FUZZ_PLUGIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let group = Fuzzed(Mutex::new(StdRng::seed_from_u64(seed)));
    slipway_goplugin::server::run_single_threaded(
        slipway_fleeting::PROTOCOL,
        move |router: tonic::transport::server::Router| {
            router.add_service(InstanceGroupServer::new(group))
        },
    )
}
