//! Networks: each slot's warm bridge network, lent to one job at a time, or a job's own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use slipway_docker::{Docker, NetworkSpec};

use super::names::{RunNames, Sweep, session};
use super::plan::Plan;
use super::{DockerExecutor, DockerExecutorError, LABEL_RUNNER, LABEL_SESSION, LABEL_SLOT_NETWORK};

/// Each slot's warm bridge network, kept across that slot's jobs (one job at a time per slot,
/// so no job ever shares it with another), removed by [`DockerExecutor::shutdown`].
#[derive(Debug)]
pub(super) struct SlotNetworks {
    /// Unique to this executor (process, time, counter): in the names and the label.
    token: String,
    slots: Mutex<HashMap<u32, SlotNet>>,
}

/// One slot's network as the executor knows it.
#[derive(Debug, Default)]
struct SlotNet {
    /// Bumped when the network may hold a job's leftovers: the next job gets a fresh one.
    generation: u32,
    created: bool,
    in_use: bool,
}

/// A slot's network, held by one job.
#[derive(Debug)]
pub(super) struct SlotLease {
    nets: Arc<SlotNetworks>,
    slot: u32,
    /// The network's name.
    pub(super) name: String,
    /// The network exists (created by an earlier job, or by this one).
    pub(super) created: bool,
    /// Set when the job's cleanup left nothing: the network stays warm.
    pub(super) clean: bool,
}

impl SlotNetworks {
    /// No slot networks yet; their names start with a token unique to this executor.
    pub(super) fn new(runner: &str) -> Self {
        SlotNetworks {
            token: RunNames::new(runner, 0).prefix.replacen("-job0-", "-", 1),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The name of `slot`'s network of that generation.
    fn name(&self, slot: u32, generation: u32) -> String {
        format!("{}-slot{slot}-g{generation}-net", self.token)
    }

    /// The slot's network for one job; `None` while another job holds it.
    pub(super) fn acquire(self: &Arc<Self>, slot: u32) -> Option<SlotLease> {
        let mut slots = self.slots.lock().ok()?;
        let s = slots.entry(slot).or_default();
        if s.in_use {
            return None;
        }
        s.in_use = true;
        Some(SlotLease {
            nets: Arc::clone(self),
            slot,
            name: self.name(slot, s.generation),
            created: s.created,
            clean: false,
        })
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        let Ok(mut slots) = self.nets.slots.lock() else {
            return;
        };
        let s = slots.entry(self.slot).or_default();
        s.in_use = false;
        if self.clean {
            s.created = self.created;
        } else {
            // Not known to be empty: never handed to another job ([`DockerExecutor::shutdown`]
            // removes it).
            s.generation += 1;
            s.created = false;
        }
    }
}

impl DockerExecutor {
    /// The warm slot networks' label filter (`com.slipway.slot-network=<token>`).
    pub fn slot_network_label(&self) -> String {
        format!("{LABEL_SLOT_NETWORK}={}", self.nets.token)
    }

    /// Remove the slots' warm networks (call when the runner stops). Jobs still running keep
    /// theirs until they end; removing one with containers attached fails and is reported.
    pub async fn shutdown(&self) -> Result<(), DockerExecutorError> {
        let label = self.slot_network_label();
        let mut failed = None;
        for n in self.docker.list_networks(Some(&label)).await? {
            match self.docker.remove_network(&n.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => failed = Some(e),
            }
        }
        if let Ok(mut slots) = self.nets.slots.lock() {
            for s in slots.values_mut() {
                s.generation += 1;
                s.created = false;
            }
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Remove the slot networks of `runner` of the sessions `sweep` names. This session's are
    /// kept but at shutdown: instances may share an engine (the local plugin's do), and a job
    /// on one of them may be about to start in its network.
    pub async fn sweep_slot_networks(
        docker: &Docker,
        runner: &str,
        sweep: Sweep,
    ) -> slipway_docker::Result<()> {
        let label = format!("{LABEL_RUNNER}={runner}");
        for n in docker.list_networks(Some(&label)).await? {
            let ours = n.labels.as_ref().is_some_and(|l| {
                l.contains_key(LABEL_SLOT_NETWORK)
                    && sweep.removes(l.get(LABEL_SESSION).map(String::as_str))
            });
            if ours {
                match docker.remove_network(&n.id).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Create the job's network, unless it is its slot's warm one and already exists.
    pub(super) async fn create_network(
        &self,
        plan: &Plan<'_>,
        lease: Option<&SlotLease>,
    ) -> slipway_docker::Result<()> {
        if !plan.create_network {
            return Ok(());
        }
        let mut net = NetworkSpec::new(&plan.network);
        net.labels = match lease {
            Some(l) => [
                (LABEL_RUNNER.to_string(), self.runner_name.clone()),
                (LABEL_SLOT_NETWORK.to_string(), l.nets.token.clone()),
                (LABEL_SESSION.to_string(), session().to_string()),
                ("com.slipway.slot".to_string(), plan.slot.to_string()),
            ]
            .into(),
            None => plan.labels.clone(),
        };
        match self.docker.create_network(&net).await {
            // Ours from a run stopped before it learnt so: empty, as its cleanup was clean.
            Err(e) if lease.is_some() && e.is_conflict() => Ok(()),
            r => r.map(drop),
        }
    }
}
