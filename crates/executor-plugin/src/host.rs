//! Host side: start an `executor-plugin-<name>` process, `Init` it, and drive jobs through it.
//!
//! The process is supervised by [`slipway_goplugin::PluginProcess`]: when it dies it is
//! restarted and re-initialized with the same config. A stage running when it died fails (the
//! caller reports a system failure); the next job runs on the restarted process.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use slipway_goplugin::process::{self, MAX_MESSAGE_SIZE};
use slipway_goplugin::{CallError, HostError, PluginProcess, ProcessOptions, Reinit};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::convert::{caps_from_pb, exit_from_pb, prepared_from_pb, status_to_error};
use crate::proto::v1 as pb;
use crate::proto::v1::executor_client::ExecutorClient;
use crate::provider::{
    Capabilities, Chunk, CleanupJob, Exit, PrepareJob, Prepared, ProviderError, Stage,
};
use crate::{PLUGIN_PREFIX, PROTOCOL};

/// Why a plugin could not be started and initialized.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Finding, spawning or connecting to the process failed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The plugin refused its config, or answered `Init` wrongly.
    #[error("plugin {plugin:?}: Init: {answer}")]
    Init {
        /// Plugin name.
        plugin: String,
        /// What it answered.
        answer: ProviderError,
    },
}

/// Resolve an executor plugin reference: a path as it is, else `executor-plugin-<name>` in
/// `plugin_dir`, next to this executable, then on `PATH`.
pub fn find_plugin(reference: &str, plugin_dir: Option<&Path>) -> Result<PathBuf, HostError> {
    if let Some(found) = process::as_path(reference) {
        return found;
    }
    let file = if reference.starts_with(PLUGIN_PREFIX) {
        reference.to_owned()
    } else {
        format!("{PLUGIN_PREFIX}{reference}")
    };
    let mut looked = Vec::new();
    let dirs = plugin_dir
        .map(Path::to_path_buf)
        .into_iter()
        .chain(process::search_dirs());
    process::find_in(&file, dirs, &mut looked).ok_or(HostError::NotFound {
        name: reference.to_owned(),
        looked,
    })
}

fn client(channel: Channel) -> ExecutorClient<Channel> {
    ExecutorClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

/// A running, initialized executor plugin.
#[derive(Debug)]
pub struct ExecutorHost {
    process: PluginProcess,
    capabilities: Capabilities,
}

impl ExecutorHost {
    /// Start the plugin and `Init` it with `config` (JSON). With `dry_run` the plugin only
    /// checks the config; stop the host afterwards.
    pub async fn start(
        opts: ProcessOptions,
        config: Vec<u8>,
        dry_run: bool,
    ) -> Result<ExecutorHost, StartError> {
        let name = opts.name.clone();
        let init = pb::InitRequest {
            config: config.clone(),
            dry_run,
        };
        let reinit_req = init.clone();
        let reinit_name = name.clone();
        let reinit: Reinit = Arc::new(move |channel| {
            let req = reinit_req.clone();
            let name = reinit_name.clone();
            Box::pin(async move {
                client(channel)
                    .init(req)
                    .await
                    .map(drop)
                    .map_err(|s| status_to_error(&name, &s).to_string())
            })
        });
        let process = PluginProcess::start(opts, PROTOCOL, Some(reinit)).await?;
        let answer = process
            .call("Init", |c| {
                let req = init.clone();
                async move { client(c.channel).init(req).await }
            })
            .await
            .map_err(|e| call_error(&name, e))
            .and_then(caps_from_pb);
        match answer {
            Ok(capabilities) => Ok(ExecutorHost {
                process,
                capabilities,
            }),
            Err(source) => {
                process.stop().await;
                Err(StartError::Init {
                    plugin: name,
                    answer: source,
                })
            }
        }
    }

    /// Plugin name.
    pub fn name(&self) -> &str {
        self.process.name()
    }

    /// What the plugin said it offers.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Process id of the current plugin process.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// How many times the plugin was restarted after dying.
    pub fn restarts(&self) -> u32 {
        self.process.restarts()
    }

    /// Make a job's environment. Sent again only when the process it went to died (and was
    /// replaced): what a dead process made is its successor's to find, never a second live one.
    pub async fn prepare(&self, job: PrepareJob) -> Result<Prepared, ProviderError> {
        let req = pb::PrepareRequest {
            job: job.job,
            isolation: job.isolation,
            resources: Some(job.resources),
            instance: job.instance,
            timeout_secs: job.timeout.as_secs(),
        };
        // The process may have died a moment ago (a crash mid-job) without the supervisor having
        // noticed yet: `call` waits for the replacement and sends again.
        self.process
            .call("Prepare", |c| {
                let req = req.clone();
                async move { client(c.channel).prepare(req).await }
            })
            .await
            .map(prepared_from_pb)
            .map_err(|e| call_error(self.name(), e))
    }

    /// Run one stage, sending its output to `output`. Dropping the future cancels the call;
    /// the plugin must then stop what the stage started.
    pub async fn run(
        &self,
        stage: Stage,
        output: mpsc::Sender<Chunk>,
    ) -> Result<Exit, ProviderError> {
        self.run_with(stage, |chunk| {
            let output = output.clone();
            async move { output.send(chunk).await.is_ok() }
        })
        .await
    }

    /// [`ExecutorHost::run`], handing each chunk to `on_chunk` (which answers whether the
    /// caller still wants the stage) instead of a channel: one hop less for a streamed trace.
    pub async fn run_with<F, Fut>(
        &self,
        stage: Stage,
        mut on_chunk: F,
    ) -> Result<Exit, ProviderError>
    where
        F: FnMut(Chunk) -> Fut + Send,
        Fut: std::future::Future<Output = bool> + Send,
    {
        let name = stage.name.clone();
        let req = pb::RunRequest {
            state: stage.state,
            stage: stage.name,
            script: stage.script,
            stdin: stage.stdin,
            instance: stage.instance,
        };
        // Opening the stream is retried as Prepare is (the request cannot have reached a live
        // process); once output flows, a dead process fails the stage.
        let mut stream = self
            .process
            .call(&format!("Run {name}"), |c| {
                let req = req.clone();
                async move { client(c.channel).run(req).await }
            })
            .await
            .map_err(|e| call_error(self.name(), e))?;
        loop {
            let msg = stream
                .message()
                .await
                .map_err(|s| self.status_error(&format!("Run {name}"), &s))?;
            let Some(msg) = msg else {
                return Err(ProviderError::Failed(format!(
                    "plugin {:?} ended stage {name} without an exit status",
                    self.name()
                )));
            };
            let chunk = match msg.output {
                Some(pb::run_output::Output::Stdout(b)) => Chunk::Stdout(b),
                Some(pb::run_output::Output::Stderr(b)) => Chunk::Stderr(b),
                Some(pb::run_output::Output::Exit(e)) => return Ok(exit_from_pb(e)),
                None => continue,
            };
            // A caller that stopped listening no longer wants the stage: end it.
            if !on_chunk(chunk).await {
                return Err(ProviderError::Failed(format!(
                    "stage {name}: output receiver closed"
                )));
            }
        }
    }

    /// Remove a job's environment (also one a previous plugin process made); lines for the
    /// job's trace.
    pub async fn cleanup(&self, job: CleanupJob) -> Result<Vec<String>, ProviderError> {
        let req = pb::CleanupRequest {
            state: job.state,
            instance: job.instance,
            job_status: job.status.as_str().to_owned(),
        };
        self.process
            .call("Cleanup", |c| {
                let req = req.clone();
                async move { client(c.channel).cleanup(req).await }
            })
            .await
            .map(|r| r.messages)
            .map_err(|e| call_error(self.name(), e))
    }

    /// Stop the plugin process (Shutdown, grace, SIGKILL of its group). Idempotent.
    pub async fn stop(&self) {
        self.process.stop().await;
    }

    fn status_error(&self, rpc: &str, s: &tonic::Status) -> ProviderError {
        if process::is_transport_error(s) {
            ProviderError::Unavailable {
                plugin: self.name().to_owned(),
                message: format!("{rpc}: the plugin process went away ({})", s.message()),
            }
        } else {
            match status_to_error(self.name(), s) {
                ProviderError::Failed(m) => ProviderError::Failed(format!("{rpc}: {m}")),
                other => other,
            }
        }
    }
}

fn call_error(plugin: &str, e: CallError) -> ProviderError {
    match e {
        CallError::Unavailable(message) => ProviderError::Unavailable {
            plugin: plugin.to_owned(),
            message,
        },
        CallError::Status(s) => status_to_error(plugin, &s),
    }
}
