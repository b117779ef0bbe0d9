//! How an ASG instance's lifecycle state and its EC2 state map to a fleeting [`State`].

use slipway_fleeting::State;

/// State of an instance the ASG lists, from its ASG lifecycle state (`InService`,
/// `Pending:Wait`, ...) and its EC2 state name (`running`, `pending`, ...), if EC2 knows it yet.
pub fn instance_state(lifecycle: &str, ec2: Option<&str>) -> State {
    // EC2's view wins when the machine is already going away: the ASG can lag behind.
    match ec2 {
        Some("terminated") => return State::Deleted,
        Some("shutting-down" | "stopping" | "stopped") => return State::Deleting,
        _ => {}
    }
    match lifecycle {
        "Terminated" | "Detached" => State::Deleted,
        l if l.starts_with("Terminating") || l == "Detaching" => State::Deleting,
        // Running only once both agree: a new instance is InService shortly before EC2
        // reports it (eventual consistency), and SSH needs EC2's `running`.
        "InService" if ec2 == Some("running") => State::Running,
        // Pending*, Warmed:*, Standby, EnteringStandby, or InService before EC2 catches up:
        // not usable yet, but not failed either.
        _ => State::Creating,
    }
}

/// State of an instance no longer listed by the ASG, from its EC2 state name (None = EC2 does
/// not know it either).
pub fn unlisted_state(ec2: Option<&str>) -> State {
    match ec2 {
        Some("shutting-down" | "stopping") => State::Deleting,
        // Terminated, gone, or detached from the group / the group deleted: not ours any more.
        _ => State::Deleted,
    }
}

/// Fleeting's architecture name for an EC2 architecture (`x86_64` → `amd64`).
pub fn arch(ec2: &str) -> &str {
    match ec2 {
        "x86_64" | "x86_64_mac" => "amd64",
        "arm64" | "arm64_mac" => "arm64",
        "i386" => "386",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lifecycle_and_ec2_states() {
        assert_eq!(instance_state("Pending", None), State::Creating);
        assert_eq!(
            instance_state("Pending:Wait", Some("pending")),
            State::Creating
        );
        assert_eq!(
            instance_state("InService", Some("pending")),
            State::Creating
        );
        assert_eq!(instance_state("InService", Some("running")), State::Running);
        assert_eq!(instance_state("InService", None), State::Creating);
        assert_eq!(
            instance_state("Terminating:Wait", Some("running")),
            State::Deleting
        );
        assert_eq!(
            instance_state("InService", Some("shutting-down")),
            State::Deleting
        );
        assert_eq!(
            instance_state("InService", Some("stopping")),
            State::Deleting
        );
        assert_eq!(
            instance_state("InService", Some("terminated")),
            State::Deleted
        );
        assert_eq!(instance_state("Terminated", None), State::Deleted);
        assert_eq!(unlisted_state(None), State::Deleted);
        assert_eq!(unlisted_state(Some("shutting-down")), State::Deleting);
        assert_eq!(unlisted_state(Some("running")), State::Deleted);
        assert_eq!(arch("x86_64"), "amd64");
    }
}
