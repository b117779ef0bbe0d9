//! Fleeting and nesting plugin replies, in process: any bytes decoded as each reply message
//! (prost, as tonic decodes a frame), then the host's conversion of the decoded reply
//! (`slipway_fleeting::convert`), gRPC statuses to contract errors, and the nesting client's
//! reading of a VM's agent address. See `plugin_process` for the real process over gRPC.

use prost::Message;
use slipway_fleeting::convert::{
    connect_info_from_pb, connect_info_to_pb, info_from_pb, state_from_pb, status_to_error,
};
use slipway_fleeting::proto::fleeting::v1 as pb;
use slipway_nesting::client::AgentAddr;
use slipway_nesting::proto as npb;

/// The input: which reply, its bytes (or a status).
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub enum Input {
    /// A reply body, decoded as every reply type.
    Body(Vec<u8>),
    /// A `ConnectInfo` reply built from fields (well-formed, any values).
    ConnectInfo {
        /// Port as sent (a `u32` on the wire).
        port: u32,
        /// `expires_unix`.
        expires: i64,
        /// Keepalive and timeout in ms.
        ms: (u64, u64),
        /// Instance id and addresses.
        text: (String, String),
    },
    /// A gRPC status: code and message.
    Status(i32, String),
}

/// Decoding and converting never panics; a converted `ConnectInfo` converts back to the same
/// wire message (expiry and port as the host reads them).
pub fn check(input: &Input) {
    match input {
        Input::Body(bytes) => check_body(bytes),
        Input::ConnectInfo {
            port,
            expires,
            ms,
            text,
        } => {
            let reply = pb::ConnectInfoResponse {
                id: text.0.clone(),
                connector: Some(pb::ConnectorConfig {
                    protocol_port: *port,
                    keepalive_ms: ms.0,
                    timeout_ms: ms.1,
                    ..Default::default()
                }),
                internal_addr: text.1.clone(),
                external_addr: String::new(),
                expires_unix: *expires,
            };
            check_connect_info(reply.encode_to_vec().as_slice());
        }
        Input::Status(code, message) => {
            let status = tonic::Status::new(tonic::Code::from_i32(*code), message.clone());
            let e = status_to_error("fuzz", &status);
            let _ = e.to_string();
        }
    }
}

/// One reply body as every reply type the host or the nesting client reads.
pub fn check_body(bytes: &[u8]) {
    if let Ok(r) = pb::InitResponse::decode(bytes) {
        let info = info_from_pb(r.info.unwrap_or_default());
        let _ = info.id.len();
    }
    if let Ok(r) = pb::UpdateResponse::decode(bytes) {
        for i in r.instances {
            let _ = (i.id, state_from_pb(i.state));
        }
    }
    let _ = pb::IncreaseResponse::decode(bytes).map(|r| r.succeeded);
    let _ = pb::DecreaseResponse::decode(bytes).map(|r| r.succeeded);
    check_connect_info(bytes);
    if let Ok(r) = npb::ListResponse::decode(bytes) {
        for vm in r.vms {
            check_agent_addr(&vm.addr);
        }
    }
    let _ = npb::CreateResponse::decode(bytes);
    let _ = npb::SnapshotResponse::decode(bytes);
    let _ = npb::ListSnapshotsResponse::decode(bytes);
}

fn check_connect_info(bytes: &[u8]) {
    let Ok(reply) = pb::ConnectInfoResponse::decode(bytes) else {
        return;
    };
    let port = reply.connector.as_ref().map_or(0, |c| c.protocol_port);
    match connect_info_from_pb(reply.clone()) {
        Ok(ci) => {
            assert!(port <= u32::from(u16::MAX), "port {port} accepted");
            let back = connect_info_to_pb(ci);
            assert_eq!(back.id, reply.id);
            assert_eq!(back.internal_addr, reply.internal_addr);
            assert_eq!(back.connector.map(|c| c.protocol_port), Some(port));
            if reply.expires_unix > 0 {
                assert_eq!(back.expires_unix, reply.expires_unix, "expiry changed");
            } else {
                assert_eq!(back.expires_unix, 0);
            }
        }
        Err(e) => assert!(e.contains("protocol_port"), "unclear error: {e}"),
    }
}

fn check_agent_addr(addr: &str) {
    if let Some(a) = AgentAddr::parse(addr) {
        assert!(addr.ends_with(a.socket()), "{addr:?} read as {a:?}");
    }
}
