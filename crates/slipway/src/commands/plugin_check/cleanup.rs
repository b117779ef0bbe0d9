//! Deleting what a run created, whatever failed and also after Ctrl-C.

use std::sync::Arc;

use slipway_fleeting::{InstanceGroup as _, PluginHost, State};

use super::checks::{Checker, progress};
use super::report::go_duration;

impl Checker<'_> {
    /// Delete whatever this run created and is still listed; restart the plugin if needed.
    pub(super) async fn cleanup(&mut self) {
        // Without the list taken before Increase, this run never asked for an instance.
        let Some(before) = self.before.clone() else {
            return;
        };
        // The host may be gone (a fresh process failed, restarts given up): start another.
        let usable = match &self.host {
            Some(h) if self.initialized => self.call("Update", h.update()).await.is_ok(),
            _ => false,
        };
        if !usable {
            progress("cleanup: starting the plugin again to delete what this run created");
            if let Some(h) = self.host.take() {
                h.stop().await;
            }
            let started = match PluginHost::start(self.plugin_options()).await {
                Ok(h) => h,
                Err(e) => {
                    progress(format_args!("cleanup: cannot start the plugin: {e}"));
                    return self.left_behind();
                }
            };
            if let Err(e) = self.call("Init", started.init_from_options()).await {
                started.stop().await;
                progress(format_args!("cleanup: cannot initialize the plugin: {e}"));
                return self.left_behind();
            }
            self.host = Some(Arc::new(started));
            self.initialized = true;
        }
        let Some(host) = self.host.clone() else {
            return;
        };
        // Everything listed now that was not there before Increase is this run's.
        let ours: Vec<String> = match self.call("Update", host.update()).await {
            Ok(list) => list
                .into_iter()
                .filter(|(i, s)| {
                    (!before.contains(i) || self.created.contains(i)) && *s != State::Deleted
                })
                .map(|(i, _)| i)
                .collect(),
            Err(e) => {
                progress(format_args!("cleanup: {e}"));
                return self.left_behind();
            }
        };
        if ours.is_empty() {
            self.created.clear();
            return;
        }
        progress(format_args!(
            "cleanup: deleting {} and waiting up to {} for it",
            ours.join(", "),
            go_duration(self.opts.timeout)
        ));
        self.created.extend(ours.iter().cloned());
        if let Err(e) = self.call("Decrease", host.decrease(&ours)).await {
            progress(format_args!("cleanup: {e}"));
        }
        match self.wait_gone(&ours).await {
            Ok(_) => {
                self.created.clear();
                progress("cleanup: done");
            }
            Err(e) => {
                progress(format_args!("cleanup: {e}"));
                self.left_behind();
            }
        }
    }

    /// Say which instances may be left for the operator to delete.
    fn left_behind(&self) {
        if !self.created.is_empty() {
            let ids: Vec<&str> = self.created.iter().map(String::as_str).collect();
            progress(format_args!(
                "instances possibly left behind, delete them by hand: {}",
                ids.join(", ")
            ));
        }
    }
}
