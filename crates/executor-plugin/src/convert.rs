//! Between the provider types and their protobuf messages, and errors to and from statuses.

use tonic::{Code, Status};

use crate::proto::v1 as pb;
use crate::provider::{Capabilities, Exit, Failure, Placement, Prepared, ProviderError};

pub(crate) fn caps_to_pb(c: Capabilities) -> pb::InitResponse {
    pb::InitResponse {
        name: c.name,
        version: c.version,
        isolation_levels: c.isolation_levels,
        placement: match c.placement {
            Placement::Local => pb::Placement::Local,
            Placement::Instance => pb::Placement::Instance,
        }
        .into(),
        job_data: c.job_data,
    }
}

pub(crate) fn caps_from_pb(r: pb::InitResponse) -> Result<Capabilities, ProviderError> {
    let placement = match pb::Placement::try_from(r.placement) {
        Ok(pb::Placement::Local) => Placement::Local,
        Ok(pb::Placement::Instance) => Placement::Instance,
        _ => {
            return Err(ProviderError::Failed(format!(
                "Init answered placement {}, expected PLACEMENT_LOCAL or PLACEMENT_INSTANCE",
                r.placement
            )));
        }
    };
    if r.isolation_levels.is_empty() {
        return Err(ProviderError::Failed(
            "Init answered no isolation_levels: a provider gives at least one".into(),
        ));
    }
    Ok(Capabilities {
        name: r.name,
        version: r.version,
        isolation_levels: r.isolation_levels,
        placement,
        job_data: r.job_data,
    })
}

fn non_empty(s: String) -> Option<String> {
    Some(s).filter(|s| !s.is_empty())
}

pub(crate) fn prepared_to_pb(p: Prepared) -> pb::PrepareResponse {
    pb::PrepareResponse {
        state: p.state,
        builds_dir: p.builds_dir.unwrap_or_default(),
        cache_dir: p.cache_dir.unwrap_or_default(),
        messages: p.messages,
    }
}

pub(crate) fn prepared_from_pb(r: pb::PrepareResponse) -> Prepared {
    Prepared {
        state: r.state,
        builds_dir: non_empty(r.builds_dir),
        cache_dir: non_empty(r.cache_dir),
        messages: r.messages,
    }
}

pub(crate) fn exit_to_pb(e: Exit) -> pb::Exit {
    pb::Exit {
        code: e.code,
        failure: match e.failure {
            Failure::None => pb::FailureKind::FailureNone,
            Failure::Script => pb::FailureKind::FailureScript,
            Failure::System => pb::FailureKind::FailureSystem,
        }
        .into(),
        message: e.message,
    }
}

pub(crate) fn exit_from_pb(e: pb::Exit) -> Exit {
    let failure = match pb::FailureKind::try_from(e.failure) {
        Ok(pb::FailureKind::FailureNone) => Failure::None,
        Ok(pb::FailureKind::FailureScript) => Failure::Script,
        // An unknown kind from a newer plugin: the environment failed, not the script.
        Ok(pb::FailureKind::FailureSystem) | Err(_) => Failure::System,
    };
    Exit {
        code: e.code,
        failure,
        message: e.message,
    }
}

pub(crate) fn error_to_status(e: ProviderError) -> Status {
    match e {
        ProviderError::InvalidConfig(m) => Status::invalid_argument(m),
        ProviderError::NotFound(m) => Status::not_found(m),
        ProviderError::Failed(m) => Status::internal(m),
        ProviderError::Unavailable { message, .. } => Status::unavailable(message),
    }
}

pub(crate) fn status_to_error(plugin: &str, s: &Status) -> ProviderError {
    let message = s.message().to_owned();
    match s.code() {
        Code::InvalidArgument => ProviderError::InvalidConfig(message),
        Code::NotFound => ProviderError::NotFound(message),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
            ProviderError::Unavailable {
                plugin: plugin.to_owned(),
                message: format!("{}: {message}", s.code()),
            }
        }
        _ => ProviderError::Failed(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_round_trip_and_unknown_kinds_are_system_failures() {
        for failure in [Failure::None, Failure::Script, Failure::System] {
            let e = Exit {
                code: 3,
                failure,
                message: "m".into(),
            };
            assert_eq!(exit_from_pb(exit_to_pb(e.clone())), e);
        }
        let odd = pb::Exit {
            code: 0,
            failure: 99,
            message: String::new(),
        };
        assert_eq!(exit_from_pb(odd).failure, Failure::System);
    }

    #[test]
    fn capabilities_need_a_placement_and_a_level() {
        let mut r = pb::InitResponse {
            name: "x".into(),
            version: "1".into(),
            isolation_levels: vec!["sandbox".into()],
            placement: 0,
            job_data: false,
        };
        let err = caps_from_pb(r.clone()).unwrap_err().to_string();
        assert!(err.contains("placement"), "{err}");
        r.placement = pb::Placement::Local.into();
        assert_eq!(caps_from_pb(r.clone()).unwrap().placement, Placement::Local);
        // What a provider offers crosses the boundary both ways.
        let mut caps = caps_from_pb(r.clone()).unwrap();
        assert!(!caps.job_data);
        caps.job_data = true;
        assert!(caps_from_pb(caps_to_pb(caps)).unwrap().job_data);
        r.isolation_levels.clear();
        let err = caps_from_pb(r).unwrap_err().to_string();
        assert!(err.contains("isolation_levels"), "{err}");
    }

    #[test]
    fn statuses_map_to_errors_and_back() {
        let e = ProviderError::InvalidConfig("key x".into());
        assert_eq!(status_to_error("p", &error_to_status(e.clone())), e);
        let e = ProviderError::NotFound("job 1".into());
        assert_eq!(status_to_error("p", &error_to_status(e.clone())), e);
        assert!(matches!(
            status_to_error("p", &Status::unavailable("gone")),
            ProviderError::Unavailable { .. }
        ));
    }
}
