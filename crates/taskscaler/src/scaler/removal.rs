//! Removing instances: the runner's cleanup hook, the plugin's Decrease, and deleting
//! everything on shutdown.

use std::time::Duration;

use slipway_fleeting::State;
use tokio::time::Instant;

use super::{Inner, call};
use crate::decision::RemovalCause;

/// Longest the runner's cleanup of an instance about to be removed may take.
const REMOVING_HOOK_TIMEOUT: Duration = Duration::from_secs(10);

impl Inner {
    pub(super) async fn remove(&self, removing: &[(String, RemovalCause)]) {
        let ids: Vec<String> = removing.iter().map(|(id, _)| id.clone()).collect();
        for (id, cause) in removing {
            tracing::info!(instance = %id, cause = cause.as_str(), "removing instance");
        }
        if let Some(hooks) = &self.hooks {
            futures::future::join_all(ids.iter().map(|id| async move {
                if tokio::time::timeout(REMOVING_HOOK_TIMEOUT, hooks.removing(id))
                    .await
                    .is_err()
                {
                    tracing::warn!(instance = %id, "runner cleanup before removal: no answer within {REMOVING_HOOK_TIMEOUT:?}");
                }
            }))
            .await;
        }
        match call(self.group.decrease(&ids)).await {
            Ok(accepted) => {
                for (id, cause) in removing {
                    if accepted.contains(id) {
                        self.metrics.scaled_down(cause.as_str());
                    }
                }
                if let Some(store) = &self.store {
                    for id in &accepted {
                        let id = id.clone();
                        store.enqueue("mark_removing", move |s| s.mark_removing(&id).map(|_| ()));
                    }
                }
                let mut book = self.lock();
                book.removed += accepted.len() as u64;
                for id in ids.iter().filter(|id| !accepted.contains(id)) {
                    if let Some(inst) = book.instances.get_mut(id) {
                        inst.removing = false;
                    }
                    book.touch(id, &self.cfg);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "plugin decrease failed; will retry");
                let mut book = self.lock();
                for id in &ids {
                    if let Some(inst) = book.instances.get_mut(id) {
                        inst.removing = false;
                    }
                    book.touch(id, &self.cfg);
                }
            }
        }
    }

    pub(super) async fn delete_all(&self) {
        let poll = self
            .cfg
            .shutdown_deletion_interval
            .min(Duration::from_millis(250));
        let keep = self.others_instances().await;
        for _ in 0..=self.cfg.shutdown_deletion_retries {
            let Some(mut alive) = self.alive_instances().await else {
                tokio::time::sleep(poll).await;
                continue;
            };
            alive.retain(|id| !keep(id));
            if alive.is_empty() {
                return;
            }
            tracing::info!(count = alive.len(), "deleting instances on shutdown");
            if let Err(e) = call(self.group.decrease(&alive)).await {
                tracing::warn!(error = %e, "decrease failed during shutdown deletion");
            }
            let until = Instant::now() + self.cfg.shutdown_deletion_interval;
            while Instant::now() < until {
                tokio::time::sleep(poll).await;
                if self
                    .alive_instances()
                    .await
                    .is_some_and(|a| a.iter().all(|id| keep(id)))
                {
                    return;
                }
            }
        }
        tracing::warn!("instances may remain after shutdown deletion retries");
    }

    /// Which listed instances a shutdown must leave alone: those another manager sharing the
    /// state store holds and, while one runs, any this manager does not know (its newest).
    async fn others_instances(&self) -> impl Fn(&str) -> bool + use<> {
        let (mut foreign, mine, others_live) = {
            let book = self.lock();
            let mine: std::collections::HashSet<String> = book.instances.keys().cloned().collect();
            (book.foreign.clone(), mine, book.others_live)
        };
        let mut others_live = others_live;
        if let Some(store) = &self.store
            && let Ok(o) = store.call(|s| s.ownership()).await
        {
            others_live = !o.others.is_empty();
            foreign = o.foreign.into_iter().collect();
        }
        move |id: &str| foreign.contains(id) || (others_live && !mine.contains(id))
    }

    async fn alive_instances(&self) -> Option<Vec<String>> {
        match call(self.group.update()).await {
            Ok(list) => Some(
                list.into_iter()
                    .filter(|(_, s)| *s != State::Deleted)
                    .map(|(id, _)| id)
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "update failed during shutdown deletion");
                None
            }
        }
    }
}
