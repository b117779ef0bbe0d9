//! What to do with stored and live instances after a restart (GitLab's `state_storage` semantics,
//! reference section 2.4, with Slipway's defaults).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use slipway_fleeting::State;

use super::{AcquisitionRecord, InstanceRecord, Snapshot};

/// Why [`plan_restore`] deletes an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteReason {
    /// The plugin lists it but the store does not know it: its use count is unknown.
    NoData,
    /// It has been given `max_use_count` jobs already.
    UsedUp {
        /// Stored use count.
        use_count: u64,
        /// Configured maximum.
        max_use_count: u64,
    },
    /// It held acquisitions of jobs that cannot resume (and `keep_instance_with_acquisitions` is
    /// off).
    HadAcquisitions {
        /// How many.
        count: usize,
    },
    /// Its deletion had been decided before the restart.
    WasRemoving,
    /// The plugin reports it `timeout` (failed or stuck).
    PluginTimeout,
    /// The plugin reports it `deleting`; deletion is requested again to see it through.
    PluginDeleting,
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeleteReason::NoData => {
                f.write_str("no data on pre-existing instance so removing for safety")
            }
            DeleteReason::UsedUp {
                use_count,
                max_use_count,
            } => write!(
                f,
                "used up: use count {use_count} reached max_use_count {max_use_count}"
            ),
            DeleteReason::HadAcquisitions { count } => write!(
                f,
                "held {count} acquisition(s) at restart; the jobs cannot resume \
                 (keep_instance_with_acquisitions = false)"
            ),
            DeleteReason::WasRemoving => f.write_str("removal was in progress before the restart"),
            DeleteReason::PluginTimeout => f.write_str("plugin reports it in state timeout"),
            DeleteReason::PluginDeleting => f.write_str("plugin reports it in state deleting"),
        }
    }
}

/// The outcome of [`plan_restore`]. Every list is sorted by instance id (acquisitions by key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestorePlan {
    /// Instances to keep using, with their stored use count and their live state.
    pub adopt: Vec<InstanceRecord>,
    /// Instances to delete through the plugin (recorded ones are to be marked removing first).
    pub delete: Vec<(String, DeleteReason)>,
    /// Recorded instances the plugin no longer lists (or reports `deleted`): drop their records.
    pub forget: Vec<String>,
    /// Acquisitions found in the store: their jobs cannot resume and must be reported failed.
    pub failed_jobs: Vec<AcquisitionRecord>,
}

/// Decide, after a restart, what to do with each instance.
///
/// `live` is what the plugin's first `Update` reported. For an instance both listed and stored:
/// its acquisitions become `failed_jobs` and, unless `keep_instance_with_acquisitions`, it is
/// deleted; it is also deleted when removal was in progress, when it is used up
/// (`use_count >= max_use_count > 0`) or when the plugin reports it `timeout` or `deleting`;
/// otherwise it is adopted with its use count. A listed instance the store does not know is
/// deleted ([`DeleteReason::NoData`]) unless already `deleted`. A stored instance the plugin no
/// longer lists, or reports `deleted`, is forgotten and its acquisitions are failed jobs.
pub fn plan_restore(
    snapshot: &Snapshot,
    live: &[(String, State)],
    max_use_count: u64,
    keep_instance_with_acquisitions: bool,
) -> RestorePlan {
    let live: HashMap<&str, State> = live.iter().map(|(id, s)| (id.as_str(), *s)).collect();
    let mut acquisitions: BTreeMap<&str, Vec<&AcquisitionRecord>> = BTreeMap::new();
    for a in &snapshot.acquisitions {
        acquisitions
            .entry(a.instance_id.as_str())
            .or_default()
            .push(a);
    }
    let stored: BTreeMap<&str, &InstanceRecord> = snapshot
        .instances
        .iter()
        .map(|i| (i.id.as_str(), i))
        .collect();

    let mut plan = RestorePlan {
        // Every stored acquisition fails, whatever becomes of its instance.
        failed_jobs: snapshot.acquisitions.clone(),
        ..RestorePlan::default()
    };
    plan.failed_jobs.sort_by(|a, b| a.key.cmp(&b.key));

    for (&id, &rec) in &stored {
        let state = match live.get(id) {
            None | Some(State::Deleted) => {
                plan.forget.push(id.to_owned());
                continue;
            }
            Some(s) => *s,
        };
        let held = acquisitions.get(id).map_or(0, Vec::len);
        let reason = if held > 0 && !keep_instance_with_acquisitions {
            Some(DeleteReason::HadAcquisitions { count: held })
        } else if rec.removing {
            Some(DeleteReason::WasRemoving)
        } else if max_use_count > 0 && rec.use_count >= max_use_count {
            Some(DeleteReason::UsedUp {
                use_count: rec.use_count,
                max_use_count,
            })
        } else if state == State::Timeout {
            Some(DeleteReason::PluginTimeout)
        } else if state == State::Deleting {
            Some(DeleteReason::PluginDeleting)
        } else {
            None
        };
        match reason {
            Some(r) => plan.delete.push((id.to_owned(), r)),
            None => plan.adopt.push(InstanceRecord {
                state,
                ..rec.clone()
            }),
        }
    }

    let mut unknown: Vec<&str> = live
        .iter()
        .filter(|&(id, s)| !stored.contains_key(id) && *s != State::Deleted)
        .map(|(id, _)| *id)
        .collect();
    unknown.sort_unstable();
    plan.delete.extend(
        unknown
            .into_iter()
            .map(|id| (id.to_owned(), DeleteReason::NoData)),
    );
    plan.delete.sort_by(|a, b| a.0.cmp(&b.0));
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(id: &str, use_count: u64) -> InstanceRecord {
        InstanceRecord {
            id: id.into(),
            state: State::Running,
            use_count,
            created_at_ms: 1,
            connect_info: None,
            removing: false,
        }
    }

    fn acq(key: &str, instance: &str) -> AcquisitionRecord {
        AcquisitionRecord {
            key: key.into(),
            instance_id: instance.into(),
            slot: 0,
            job_ref: format!("job-{key}"),
            acquired_at_ms: 2,
        }
    }

    fn live(ids: &[&str]) -> Vec<(String, State)> {
        ids.iter()
            .map(|id| ((*id).to_owned(), State::Running))
            .collect()
    }

    #[test]
    fn listed_and_stored_is_adopted_with_its_use_count() {
        let snap = Snapshot {
            instances: vec![inst("a", 2), inst("b", 0)],
            acquisitions: vec![],
        };
        let plan = plan_restore(&snap, &live(&["a", "b"]), 3, false);
        assert_eq!(plan.adopt, vec![inst("a", 2), inst("b", 0)]);
        assert!(plan.delete.is_empty() && plan.forget.is_empty() && plan.failed_jobs.is_empty());
    }

    #[test]
    fn adopted_instance_takes_the_live_state() {
        let mut rec = inst("a", 0);
        rec.state = State::Creating;
        let snap = Snapshot {
            instances: vec![rec],
            acquisitions: vec![],
        };
        let plan = plan_restore(&snap, &live(&["a"]), 0, false);
        assert_eq!(plan.adopt[0].state, State::Running);
    }

    #[test]
    fn used_up_instance_is_deleted() {
        let snap = Snapshot {
            instances: vec![inst("a", 3), inst("b", 4), inst("c", 2)],
            acquisitions: vec![],
        };
        let plan = plan_restore(&snap, &live(&["a", "b", "c"]), 3, false);
        assert_eq!(
            plan.delete,
            vec![
                (
                    "a".into(),
                    DeleteReason::UsedUp {
                        use_count: 3,
                        max_use_count: 3
                    }
                ),
                (
                    "b".into(),
                    DeleteReason::UsedUp {
                        use_count: 4,
                        max_use_count: 3
                    }
                ),
            ]
        );
        assert_eq!(plan.adopt, vec![inst("c", 2)]);
    }

    #[test]
    fn max_use_count_zero_means_unlimited() {
        let snap = Snapshot {
            instances: vec![inst("a", 1000)],
            acquisitions: vec![],
        };
        let plan = plan_restore(&snap, &live(&["a"]), 0, false);
        assert_eq!(plan.adopt, vec![inst("a", 1000)]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn instance_with_acquisitions_fails_its_jobs_and_is_deleted() {
        let snap = Snapshot {
            instances: vec![inst("a", 1), inst("b", 1)],
            acquisitions: vec![acq("k2", "a"), acq("k1", "a")],
        };
        let plan = plan_restore(&snap, &live(&["a", "b"]), 0, false);
        assert_eq!(plan.failed_jobs, vec![acq("k1", "a"), acq("k2", "a")]);
        assert_eq!(
            plan.delete,
            vec![("a".into(), DeleteReason::HadAcquisitions { count: 2 })]
        );
        assert_eq!(plan.adopt, vec![inst("b", 1)]);
    }

    #[test]
    fn keep_instance_with_acquisitions_adopts_it_but_still_fails_the_jobs() {
        let snap = Snapshot {
            instances: vec![inst("a", 1)],
            acquisitions: vec![acq("k1", "a")],
        };
        let plan = plan_restore(&snap, &live(&["a"]), 0, true);
        assert_eq!(plan.failed_jobs, vec![acq("k1", "a")]);
        assert_eq!(plan.adopt, vec![inst("a", 1)]);
        assert!(plan.delete.is_empty());

        // Kept, unless used up.
        let plan = plan_restore(&snap, &live(&["a"]), 1, true);
        assert_eq!(plan.failed_jobs, vec![acq("k1", "a")]);
        assert!(plan.adopt.is_empty());
        assert!(matches!(plan.delete[0].1, DeleteReason::UsedUp { .. }));
    }

    #[test]
    fn unknown_live_instance_is_deleted_for_safety() {
        let snap = Snapshot::default();
        let mut l = live(&["z", "y"]);
        l.push(("gone".into(), State::Deleted));
        let plan = plan_restore(&snap, &l, 0, false);
        assert_eq!(
            plan.delete,
            vec![
                ("y".into(), DeleteReason::NoData),
                ("z".into(), DeleteReason::NoData)
            ]
        );
        assert_eq!(
            DeleteReason::NoData.to_string(),
            "no data on pre-existing instance so removing for safety"
        );
        assert!(plan.adopt.is_empty() && plan.forget.is_empty());
    }

    #[test]
    fn stored_instance_no_longer_listed_is_forgotten_and_its_jobs_fail() {
        let snap = Snapshot {
            instances: vec![inst("a", 1), inst("b", 1), inst("c", 1)],
            acquisitions: vec![acq("k1", "a")],
        };
        let l = vec![
            ("b".to_owned(), State::Deleted),
            ("c".to_owned(), State::Running),
        ];
        let plan = plan_restore(&snap, &l, 0, false);
        assert_eq!(plan.forget, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(plan.failed_jobs, vec![acq("k1", "a")]);
        assert_eq!(plan.adopt, vec![inst("c", 1)]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn removing_timeout_and_deleting_instances_are_deleted() {
        let mut r = inst("r", 0);
        r.removing = true;
        let snap = Snapshot {
            instances: vec![r, inst("t", 0), inst("d", 0)],
            acquisitions: vec![],
        };
        let l = vec![
            ("r".to_owned(), State::Running),
            ("t".to_owned(), State::Timeout),
            ("d".to_owned(), State::Deleting),
        ];
        let plan = plan_restore(&snap, &l, 0, true);
        assert_eq!(
            plan.delete,
            vec![
                ("d".into(), DeleteReason::PluginDeleting),
                ("r".into(), DeleteReason::WasRemoving),
                ("t".into(), DeleteReason::PluginTimeout),
            ]
        );
        assert!(plan.adopt.is_empty());
    }
}
