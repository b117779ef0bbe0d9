//! Conversions between the Rust contract types and the `fleeting.v1` wire messages.

use std::time::{Duration, UNIX_EPOCH};

use tonic::{Code, Status};

use crate::group::{ConnectInfo, ConnectorConfig, GroupError, ProviderInfo, State};
use crate::proto::fleeting::v1 as pb;

/// Contract connector config to the wire message.
pub fn connector_to_pb(c: &ConnectorConfig) -> pb::ConnectorConfig {
    pb::ConnectorConfig {
        os: c.os.clone(),
        arch: c.arch.clone(),
        protocol: c.protocol.clone(),
        protocol_port: u32::from(c.protocol_port),
        username: c.username.clone(),
        password: c.password.clone(),
        key: c.key.clone(),
        use_static_credentials: c.use_static_credentials,
        keepalive_ms: duration_ms(c.keepalive),
        timeout_ms: duration_ms(c.timeout),
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Host side: a wire connector config to the contract's (a port above 65535 is an error).
pub fn connector_from_pb(c: pb::ConnectorConfig) -> Result<ConnectorConfig, String> {
    let protocol_port = u16::try_from(c.protocol_port)
        .map_err(|_| format!("protocol_port {} is out of range", c.protocol_port))?;
    Ok(ConnectorConfig {
        os: c.os,
        arch: c.arch,
        protocol: c.protocol,
        protocol_port,
        username: c.username,
        password: c.password,
        key: c.key,
        use_static_credentials: c.use_static_credentials,
        keepalive: Duration::from_millis(c.keepalive_ms),
        timeout: Duration::from_millis(c.timeout_ms),
    })
}

pub(crate) fn info_to_pb(i: ProviderInfo) -> pb::ProviderInfo {
    pb::ProviderInfo {
        id: i.id,
        max_size: i.max_size,
        version: i.version,
        build_info: i.build_info,
        capabilities: i.capabilities,
    }
}

/// Host side: the `Init` reply's provider info.
pub fn info_from_pb(i: pb::ProviderInfo) -> ProviderInfo {
    ProviderInfo {
        id: i.id,
        max_size: i.max_size,
        version: i.version,
        build_info: i.build_info,
        capabilities: i.capabilities,
    }
}

pub(crate) fn state_to_pb(s: State) -> pb::State {
    match s {
        State::Creating => pb::State::Creating,
        State::Running => pb::State::Running,
        State::Deleting => pb::State::Deleting,
        State::Deleted => pb::State::Deleted,
        State::Timeout => pb::State::Timeout,
    }
}

/// Wire state to contract state. Suspend states and unknown values have no Rust counterpart yet;
/// they map to `Timeout` so the taskscaler stops using (and removes) such an instance rather than
/// scheduling jobs on it.
pub fn state_from_pb(raw: i32) -> State {
    match pb::State::try_from(raw) {
        Ok(pb::State::Creating) => State::Creating,
        Ok(pb::State::Running) => State::Running,
        Ok(pb::State::Deleting) => State::Deleting,
        Ok(pb::State::Deleted) => State::Deleted,
        _ => State::Timeout,
    }
}

/// Plugin side: contract connect info to the wire reply.
pub fn connect_info_to_pb(c: ConnectInfo) -> pb::ConnectInfoResponse {
    let expires_unix = c
        .expires
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    pb::ConnectInfoResponse {
        id: c.id,
        connector: Some(connector_to_pb(&c.connector)),
        internal_addr: c.internal_addr,
        external_addr: c.external_addr,
        expires_unix,
    }
}

/// Host side: a `ConnectInfo` reply to the contract's.
pub fn connect_info_from_pb(c: pb::ConnectInfoResponse) -> Result<ConnectInfo, String> {
    // 0 means "never"; negative values are treated the same.
    let expires = if c.expires_unix > 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(c.expires_unix.unsigned_abs()))
    } else {
        None
    };
    Ok(ConnectInfo {
        id: c.id,
        connector: connector_from_pb(c.connector.unwrap_or_default())?,
        internal_addr: c.internal_addr,
        external_addr: c.external_addr,
        expires,
    })
}

/// Plugin side: contract error to gRPC status (the host maps it back with [`status_to_error`]).
pub(crate) fn error_to_status(e: GroupError) -> Status {
    match e {
        GroupError::InvalidArgument(m) => Status::invalid_argument(m),
        GroupError::NotFound(id) => Status::not_found(id),
        GroupError::FailedPrecondition(m) => Status::failed_precondition(m),
        GroupError::Provider(m) => Status::internal(m),
        GroupError::Capacity(m) => Status::resource_exhausted(m),
        e @ GroupError::Unavailable { .. } => Status::unavailable(e.to_string()),
    }
}

/// Host side: a status the plugin returned to a contract error.
pub fn status_to_error(plugin: &str, s: &Status) -> GroupError {
    let m = s.message().to_owned();
    match s.code() {
        Code::InvalidArgument | Code::OutOfRange => GroupError::InvalidArgument(m),
        Code::NotFound => GroupError::NotFound(m),
        Code::ResourceExhausted => GroupError::Capacity(m),
        Code::FailedPrecondition | Code::AlreadyExists => GroupError::FailedPrecondition(m),
        Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded => GroupError::Unavailable {
            plugin: plugin.to_owned(),
            message: m,
        },
        code => GroupError::Provider(if m.is_empty() { format!("{code:?}") } else { m }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_info_round_trip() {
        let ci = ConnectInfo {
            id: "i-1".into(),
            connector: ConnectorConfig {
                os: "linux".into(),
                protocol_port: 22,
                password: "pw".into(),
                keepalive: Duration::from_secs(30),
                ..Default::default()
            },
            internal_addr: "10.0.0.1".into(),
            external_addr: String::new(),
            expires: Some(UNIX_EPOCH + Duration::from_secs(1_900_000_000)),
        };
        assert_eq!(
            connect_info_from_pb(connect_info_to_pb(ci.clone())).unwrap(),
            ci
        );
    }

    #[test]
    fn errors_round_trip() {
        for e in [
            GroupError::InvalidArgument("x".into()),
            GroupError::NotFound("i-1".into()),
            GroupError::FailedPrecondition("not initialized".into()),
            GroupError::Provider("boom".into()),
            GroupError::Capacity("InsufficientInstanceCapacity".into()),
        ] {
            let want = e.to_string();
            assert_eq!(status_to_error("p", &error_to_status(e)).to_string(), want);
        }
    }

    #[test]
    fn states_round_trip() {
        for s in [
            State::Creating,
            State::Running,
            State::Deleting,
            State::Deleted,
            State::Timeout,
        ] {
            assert_eq!(state_from_pb(state_to_pb(s) as i32), s);
        }
        assert_eq!(state_from_pb(pb::State::Suspended as i32), State::Timeout);
        assert_eq!(state_from_pb(99), State::Timeout);
    }
}
