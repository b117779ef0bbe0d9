//! Images: the pull policies applied to the job's and its services' images.

use super::DockerExecutor;
use super::config::{PullPolicy, join};
use slipway_job::trace::Trace;

impl DockerExecutor {
    /// Each image (the build's, then the services') as its policies say, in order; the message
    /// for the trace at the first that no policy gives.
    pub(super) async fn pull_images(
        &self,
        policies: &[(String, Vec<PullPolicy>)],
        trace: &mut Trace,
    ) -> Result<(), String> {
        for (name, p) in policies {
            self.ensure_image(name, p, trace).await?;
        }
        Ok(())
    }

    /// Pull `image` as `policies` say; the message for the trace when no policy gives it.
    async fn ensure_image(
        &self,
        image: &str,
        policies: &[PullPolicy],
        trace: &mut Trace,
    ) -> Result<(), String> {
        let mut last = String::from("no pull policy");
        for policy in policies {
            let attempt = match policy {
                PullPolicy::Never => match self.docker.inspect_image(image).await {
                    Ok(_) => Ok(true),
                    Err(e) => Err(e.to_string()),
                },
                PullPolicy::IfNotPresent => match self.docker.image_exists(image).await {
                    Ok(true) => Ok(true),
                    Ok(false) => self.pull(image, trace).await.map(|()| false),
                    Err(e) => Err(e.to_string()),
                },
                PullPolicy::Always => self.pull(image, trace).await.map(|()| false),
            };
            match attempt {
                Ok(true) => {
                    trace.message(&format!("Using locally found image {image}"));
                    return Ok(());
                }
                Ok(false) => return Ok(()),
                Err(e) => {
                    trace.message(&format!(
                        "WARNING: Failed to pull image {image} with policy \"{policy}\": {e}"
                    ));
                    last = e;
                }
            }
        }
        Err(format!(
            "failed to pull image \"{image}\" with specified policies [{}]: {last}",
            join(policies)
        ))
    }

    /// Pull `image`, saying so in the trace; the engine's message when it fails.
    async fn pull(&self, image: &str, trace: &mut Trace) -> Result<(), String> {
        trace.message(&format!("Pulling docker image {image} ..."));
        self.docker.pull_image(image).await.map_err(|e| match e {
            slipway_docker::Error::Pull { message, .. } => message,
            other => other.to_string(),
        })
    }
}
