//! A tiny HTTP/1.1 client over a unix socket, for the REST APIs of Firecracker and Cloud
//! Hypervisor: one connection per request (both servers are local and cheap to dial, and a
//! fresh connection never inherits a half-read response). Also the small pieces the REST-driven
//! backends' process handling (`rest`) builds on: waiting for the API socket, stale
//! sockets, versions, paths.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HOST};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::{HypervisorError, VmProcess, is_running};

/// One API call as a backend renders it: method, path, optional JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiCall {
    /// HTTP method.
    pub method: Method,
    /// Path (with the API's prefix, e.g. `/api/v1/vm.boot`).
    pub path: String,
    /// JSON body, if the call has one.
    pub body: Option<Value>,
}

impl ApiCall {
    /// A call with a JSON body.
    pub fn new(method: Method, path: impl Into<String>, body: Value) -> Self {
        Self {
            method,
            path: path.into(),
            body: Some(body),
        }
    }

    /// A call without a body.
    pub fn bare(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            body: None,
        }
    }

    /// `METHOD /path`, for error messages.
    pub fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// A successful (2xx) answer (which 2xx does not matter to any caller).
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// Raw body.
    pub(crate) body: Bytes,
}

impl Reply {
    /// The body as JSON (`Null` when empty or not JSON).
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Send `call` to the API server on `socket`; a non-2xx answer is [`HypervisorError::Api`] with
/// the server's message.
pub(crate) async fn request(
    hypervisor: &'static str,
    socket: &Path,
    call: &ApiCall,
    timeout: Duration,
) -> Result<Reply, HypervisorError> {
    match tokio::time::timeout(timeout, exchange(hypervisor, socket, call)).await {
        Ok(result) => result,
        Err(_) => Err(HypervisorError::Timeout {
            what: format!(
                "{hypervisor} API ({} on {})",
                call.describe(),
                socket.display()
            ),
            after: timeout,
        }),
    }
}

async fn exchange(
    hypervisor: &'static str,
    socket: &Path,
    call: &ApiCall,
) -> Result<Reply, HypervisorError> {
    let io_error = |what: &str, source: std::io::Error| HypervisorError::Io {
        context: format!(
            "{hypervisor} API {what} ({} on {})",
            call.describe(),
            socket.display()
        ),
        source,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| io_error("connect", e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| io_error("handshake", std::io::Error::other(e)))?;
    // Ends on its own once the sender is dropped after the one exchange.
    tokio::spawn(async move {
        let _ = connection.await;
    });

    let mut builder = Request::builder()
        .method(call.method.clone())
        .uri(call.path.as_str())
        .header(HOST, "localhost")
        .header(ACCEPT, "application/json");
    let body = match &call.body {
        Some(value) => {
            builder = builder.header(CONTENT_TYPE, "application/json");
            Bytes::from(value.to_string())
        }
        None => Bytes::new(),
    };
    let req = builder
        .body(Full::new(body))
        .map_err(|e| io_error("request", std::io::Error::other(e)))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| io_error("exchange", std::io::Error::other(e)))?;
    let status = resp.status();
    tracing::debug!(hypervisor, request = %call.describe(), status = status.as_u16(), "API call");
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| io_error("response body", std::io::Error::other(e)))?
        .to_bytes();
    if status.is_success() {
        Ok(Reply { body })
    } else {
        Err(HypervisorError::Api {
            hypervisor,
            request: call.describe(),
            message: format!("HTTP {}: {}", status.as_u16(), fault_message(&body)),
        })
    }
}

/// The error text of a refused request: Firecracker's `{"fault_message": …}`, otherwise the
/// body as text (Cloud Hypervisor answers plain text).
pub(crate) fn fault_message(body: &[u8]) -> String {
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body)
        && let Some(Value::String(message)) = map.get("fault_message")
    {
        return message.clone();
    }
    let text = String::from_utf8_lossy(body).trim().to_string();
    if text.is_empty() {
        "(no message)".to_string()
    } else {
        text
    }
}

/// Wait until `vm`'s process carries its marker (its exec has finished) and the API server on
/// its control socket answers `probe` with a 2xx, while `child` still runs.
pub(crate) async fn wait_ready(
    hypervisor: &'static str,
    binary: &str,
    child: &mut tokio::process::Child,
    vm: &VmProcess,
    probe: &ApiCall,
    log: &Path,
    limit: Duration,
) -> Result<(), HypervisorError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(HypervisorError::Exited {
                binary: binary.to_string(),
                status: status.to_string(),
                log: crate::hypervisor::process::log_tail(log, 20),
            });
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let attempt = Duration::from_millis(500).min(left.max(Duration::from_millis(1)));
        // The marker check first: right after spawn the command line can still be empty, and
        // a socket answering then may be a leftover server rather than this process.
        if is_running(vm)
            && request(hypervisor, &vm.control, probe, attempt)
                .await
                .is_ok()
        {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(HypervisorError::Timeout {
                what: format!("{hypervisor} API socket {}", vm.control.display()),
                after: limit,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Remove a leftover socket file at `path` unless something still answers on it (a live
/// server's socket is left alone: it may be another VM's, or a test's fake server).
pub(crate) async fn remove_stale_socket(path: &Path) -> Result<(), HypervisorError> {
    if tokio::fs::symlink_metadata(path).await.is_err() {
        return Ok(());
    }
    if tokio::net::UnixStream::connect(path).await.is_ok() {
        return Ok(());
    }
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(HypervisorError::Io {
            context: format!("cannot remove stale socket {}", path.display()),
            source,
        }),
    }
}

/// Whether something answers on the unix socket `path`.
pub(crate) async fn answers(path: &Path) -> bool {
    tokio::net::UnixStream::connect(path).await.is_ok()
}

/// The host CPU's model name (`/proc/cpuinfo`), `unknown` when it has none.
pub(crate) fn host_cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(key, _)| matches!(key.trim(), "model name" | "Model" | "cpu model"))
        .map(|(_, value)| value.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// `<binary> --version`'s output.
pub(crate) async fn binary_version(
    binary: &str,
    timeout: Duration,
) -> Result<String, HypervisorError> {
    let run = tokio::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(out)) => out,
        Ok(Err(source)) => {
            return Err(HypervisorError::Spawn {
                binary: binary.to_string(),
                source,
            });
        }
        Err(_) => {
            return Err(HypervisorError::Timeout {
                what: format!("{binary} --version"),
                after: timeout,
            });
        }
    };
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `v1.10.1` and `1.10.1` name the same build.
pub(crate) fn normalize_version(v: &str) -> String {
    v.trim().trim_start_matches('v').to_string()
}

/// `path` as UTF-8 (JSON and argv carry text; a non-UTF-8 path would be silently mangled).
pub(crate) fn path_str<'a>(
    hypervisor: &'static str,
    path: &'a Path,
    what: &str,
) -> Result<&'a str, HypervisorError> {
    path.to_str().ok_or_else(|| HypervisorError::Spec {
        hypervisor,
        message: format!("{what} path {} is not UTF-8", path.display()),
    })
}

/// `dir` made absolute against the current directory (the VMM's working directory is ours,
/// but an absolute path stays right if that ever changes).
pub(crate) fn absolute(dir: &Path) -> Result<PathBuf, HypervisorError> {
    std::path::absolute(dir).map_err(|source| HypervisorError::Io {
        context: format!("cannot make {} absolute", dir.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_message_prefers_firecracker_json() {
        assert_eq!(
            fault_message(br#"{"fault_message":"bad drive"}"#),
            "bad drive"
        );
        assert_eq!(fault_message(b"VM is not created\n"), "VM is not created");
        assert_eq!(fault_message(b""), "(no message)");
    }

    #[test]
    fn versions_are_normalized() {
        assert_eq!(normalize_version("v1.10.1"), "1.10.1");
        assert_eq!(normalize_version("1.17.0-dev"), "1.17.0-dev");
    }
}
