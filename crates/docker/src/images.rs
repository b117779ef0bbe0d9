//! Images: inspect, list, pull (with progress), import from a tar, remove.

use std::collections::HashMap;
use std::pin::Pin;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde::Deserialize;
use tokio::io::AsyncRead;
use tokio_util::io::ReaderStream;

use crate::client::{Docker, Req, seg};
use crate::error::{Error, Result};
use crate::stream::JsonStream;

/// `GET /images/{name}/json` (the parts we use).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ImageInspect {
    /// Image ID (`sha256:…`).
    pub id: String,
    /// Tags pointing at the image.
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    /// Creation time (RFC 3339).
    #[serde(default)]
    pub created: String,
    /// Size in bytes.
    #[serde(default)]
    pub size: i64,
    /// CPU architecture.
    #[serde(default)]
    pub architecture: String,
    /// Operating system.
    #[serde(default)]
    pub os: String,
    /// The image's default run configuration.
    #[serde(default)]
    pub config: Option<ImageConfig>,
}

/// An image's default run configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ImageConfig {
    /// Default environment.
    #[serde(default)]
    pub env: Option<Vec<String>>,
    /// Default command.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// Default entrypoint.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Default working directory.
    #[serde(default)]
    pub working_dir: String,
    /// Default user.
    #[serde(default)]
    pub user: String,
    /// Image labels.
    #[serde(default)]
    pub labels: Option<HashMap<String, String>>,
}

/// One entry of `GET /images/json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ImageSummary {
    /// Image ID.
    pub id: String,
    /// Tags pointing at the image.
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    /// Size in bytes.
    #[serde(default)]
    pub size: i64,
    /// Creation time (Unix seconds).
    #[serde(default)]
    pub created: i64,
    /// Image labels.
    #[serde(default)]
    pub labels: Option<HashMap<String, String>>,
}

/// One message of a pull or import progress stream.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressMessage {
    /// Layer or image ID the message is about.
    #[serde(default)]
    pub id: Option<String>,
    /// Human-readable status, e.g. `Downloading`.
    #[serde(default)]
    pub status: Option<String>,
    /// Progress bar text.
    #[serde(default)]
    pub progress: Option<String>,
    /// Numeric progress.
    #[serde(default)]
    pub progress_detail: Option<ProgressDetail>,
    /// Error text, when the operation failed mid-stream.
    #[serde(default)]
    pub error: Option<String>,
    /// Structured error.
    #[serde(default)]
    pub error_detail: Option<ErrorDetail>,
}

/// Numeric progress of one layer.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProgressDetail {
    /// Bytes done.
    #[serde(default)]
    pub current: Option<i64>,
    /// Bytes in total.
    #[serde(default)]
    pub total: Option<i64>,
}

/// Structured error of a progress stream.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorDetail {
    /// Error code, if any.
    #[serde(default)]
    pub code: Option<i64>,
    /// Error message.
    #[serde(default)]
    pub message: Option<String>,
}

impl ProgressMessage {
    fn error_message(&self) -> Option<String> {
        self.error_detail
            .as_ref()
            .and_then(|d| d.message.clone())
            .or_else(|| self.error.clone())
    }
}

/// A stream of progress messages; an error in the stream ends it with `Err`.
pub type ProgressStream = Pin<Box<dyn Stream<Item = Result<ProgressMessage>> + Send>>;

/// Splits `name[:tag]` / `name@digest` into what `fromImage` and `tag` expect; no tag means
/// `latest` (an empty tag would pull every tag).
pub fn split_reference(image: &str) -> (&str, &str) {
    if let Some((name, digest)) = image.split_once('@') {
        return (name, digest);
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => (&image[..last_slash + i], &image[last_slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// Options for [`Docker::import_image`].
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Repository to tag the image with, e.g. `slipway-busybox`.
    pub repo: String,
    /// Tag; `latest` when empty.
    pub tag: String,
    /// Dockerfile instructions applied to the image, e.g. `CMD ["/bin/sh"]`.
    pub changes: Vec<String>,
    /// Commit message.
    pub message: Option<String>,
}

impl Docker {
    /// `GET /images/{name}/json`; [`Error::NotFound`] when absent.
    pub async fn inspect_image(&self, name: &str) -> Result<ImageInspect> {
        self.json(Req::get(format!("/images/{}/json", seg(name))))
            .await
    }

    /// Whether the image exists locally.
    pub async fn image_exists(&self, name: &str) -> Result<bool> {
        match self.inspect_image(name).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `GET /images/json`, optionally only images carrying `label` (`key` or `key=value`).
    pub async fn list_images(&self, label: Option<&str>) -> Result<Vec<ImageSummary>> {
        self.json(Req::get("/images/json").label_filter(label))
            .await
    }

    /// `POST /images/create?fromImage=…` as a progress stream. A refusal before the stream
    /// starts (e.g. registry unreachable) and an error inside it are both [`Error::Pull`].
    pub async fn pull_image_stream(&self, image: &str) -> Result<ProgressStream> {
        let (name, tag) = split_reference(image);
        let req = Req::post("/images/create")
            .query("fromImage", name)
            .query("tag", tag);
        let body = self.send(req).await.map_err(|e| Error::Pull {
            image: image.to_string(),
            status: e.status(),
            message: match e {
                Error::NotFound { message }
                | Error::Conflict { message }
                | Error::Api { message, .. } => message,
                other => other.to_string(),
            },
        })?;
        let image = image.to_string();
        let stream = JsonStream::<ProgressMessage>::new(body).map(move |m| {
            let m = m?;
            match m.error_message() {
                Some(message) => Err(Error::Pull {
                    image: image.clone(),
                    status: None,
                    message,
                }),
                None => Ok(m),
            }
        });
        Ok(Box::pin(stream))
    }

    /// Pulls `image` to the end, calling `progress` for each message.
    pub async fn pull_image_with_progress(
        &self,
        image: &str,
        mut progress: impl FnMut(&ProgressMessage) + Send,
    ) -> Result<()> {
        let mut stream = self.pull_image_stream(image).await?;
        while let Some(msg) = stream.next().await {
            progress(&msg?);
        }
        Ok(())
    }

    /// Pulls `image` to the end.
    pub async fn pull_image(&self, image: &str) -> Result<()> {
        self.pull_image_with_progress(image, |_| {}).await
    }

    /// `docker import`: `POST /images/create?fromSrc=-` with the tar in memory. Returns the
    /// new image's ID.
    pub async fn import_image(&self, tar: Bytes, opts: &ImportOptions) -> Result<String> {
        let req = import_req(opts).bytes(tar, "application/x-tar");
        self.import_with(req).await
    }

    /// `docker import` streaming the tar from `reader`. Returns the new image's ID.
    pub async fn import_image_from_reader<R>(
        &self,
        reader: R,
        opts: &ImportOptions,
    ) -> Result<String>
    where
        R: AsyncRead + Send + 'static,
    {
        let frames = ReaderStream::new(reader).map_ok(Frame::data);
        let body = BodyExt::boxed_unsync(StreamBody::new(frames));
        let req = import_req(opts).stream(body, "application/x-tar");
        self.import_with(req).await
    }

    async fn import_with(&self, req: Req) -> Result<String> {
        let mut stream = JsonStream::<ProgressMessage>::new(self.send(req).await?);
        let mut id = None;
        while let Some(msg) = stream.next().await {
            let msg = msg?;
            if let Some(message) = msg.error_message() {
                return Err(Error::Stream(format!("import: {message}")));
            }
            if let Some(s) = msg.status.filter(|s| s.starts_with("sha256:")) {
                id = Some(s);
            }
        }
        id.ok_or_else(|| Error::Stream("import: the engine reported no image ID".into()))
    }

    /// `DELETE /images/{name}`; `force` also removes it when containers use it.
    pub async fn remove_image(&self, name: &str, force: bool) -> Result<()> {
        self.empty(Req::delete(format!("/images/{}", seg(name))).query_bool("force", force))
            .await
    }
}

fn import_req(opts: &ImportOptions) -> Req {
    let tag = if opts.tag.is_empty() {
        "latest"
    } else {
        &opts.tag
    };
    let mut req = Req::post("/images/create")
        .query("fromSrc", "-")
        .query("repo", opts.repo.clone())
        .query("tag", tag)
        .query_opt("message", opts.message.clone());
    for change in &opts.changes {
        req = req.query("changes", change.clone());
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_references() {
        assert_eq!(split_reference("busybox"), ("busybox", "latest"));
        assert_eq!(split_reference("busybox:1.36"), ("busybox", "1.36"));
        assert_eq!(
            split_reference("registry:5000/team/app"),
            ("registry:5000/team/app", "latest")
        );
        assert_eq!(
            split_reference("registry:5000/team/app:v2"),
            ("registry:5000/team/app", "v2")
        );
        assert_eq!(split_reference("app@sha256:abcd"), ("app", "sha256:abcd"));
    }
}
