//! QEMU's machine protocol (QMP) over its unix socket: one connection per operation, events
//! skipped, errors carried as [`HypervisorError::Api`].

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;

use super::HypervisorError;

/// A QMP session past the capabilities negotiation.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
    timeout: Duration,
}

impl Qmp {
    /// Connect to `socket`, read the greeting, negotiate; every step bounded by `timeout`.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Qmp, HypervisorError> {
        let stream = tokio::time::timeout(timeout, UnixStream::connect(socket))
            .await
            .map_err(|_| HypervisorError::Timeout {
                what: format!("QMP socket {}", socket.display()),
                after: timeout,
            })?
            .map_err(|source| HypervisorError::Io {
                context: format!("cannot connect to QMP socket {}", socket.display()),
                source,
            })?;
        let (r, w) = stream.into_split();
        let mut qmp = Qmp {
            reader: BufReader::new(r),
            writer: w,
            timeout,
        };
        let greeting = qmp.read_message().await?;
        if greeting.get("QMP").is_none() {
            return Err(HypervisorError::Api {
                hypervisor: "qemu",
                request: "greeting".into(),
                message: format!("unexpected greeting {greeting}"),
            });
        }
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    async fn read_message(&mut self) -> Result<Value, HypervisorError> {
        let mut line = String::new();
        let n = tokio::time::timeout(self.timeout, self.reader.read_line(&mut line))
            .await
            .map_err(|_| HypervisorError::Timeout {
                what: "a QMP reply".into(),
                after: self.timeout,
            })?
            .map_err(|source| HypervisorError::Io {
                context: "reading QMP".into(),
                source,
            })?;
        if n == 0 {
            return Err(HypervisorError::Io {
                context: "reading QMP".into(),
                source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            });
        }
        serde_json::from_str(&line).map_err(|e| HypervisorError::Api {
            hypervisor: "qemu",
            request: "read".into(),
            message: format!("unparsable QMP message: {e}"),
        })
    }

    /// Run one command; its `return` value.
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, HypervisorError> {
        let mut msg = json!({ "execute": command });
        if let Some(args) = arguments {
            msg["arguments"] = args;
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(b'\n');
        self.writer
            .write_all(&bytes)
            .await
            .map_err(|source| HypervisorError::Io {
                context: format!("sending QMP {command}"),
                source,
            })?;
        loop {
            let reply = self.read_message().await?;
            if reply.get("event").is_some() {
                continue;
            }
            if let Some(ret) = reply.get("return") {
                return Ok(ret.clone());
            }
            if let Some(err) = reply.get("error") {
                return Err(HypervisorError::Api {
                    hypervisor: "qemu",
                    request: command.to_string(),
                    message: err
                        .get("desc")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown error")
                        .to_string(),
                });
            }
        }
    }

    /// Poll `query-migrate` until the migration completes; an error if it fails or `limit` passes.
    pub async fn wait_migration(&mut self, limit: Duration) -> Result<(), HypervisorError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let status = self.execute("query-migrate", None).await?;
            match status.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some("failed") | Some("cancelled") => {
                    return Err(HypervisorError::Api {
                        hypervisor: "qemu",
                        request: "migrate".into(),
                        message: status
                            .get("error-desc")
                            .and_then(Value::as_str)
                            .unwrap_or("migration failed")
                            .to_string(),
                    });
                }
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HypervisorError::Timeout {
                    what: "migration".into(),
                    after: limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Poll `query-status` until the run state is `want`.
    pub async fn wait_status(
        &mut self,
        want: &str,
        limit: Duration,
    ) -> Result<(), HypervisorError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let status = self.execute("query-status", None).await?;
            if status.get("status").and_then(Value::as_str) == Some(want) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HypervisorError::Timeout {
                    what: format!("VM state {want} (now {status})"),
                    after: limit,
                });
            }
            // A restore waits on this: a short poll costs QEMU little and the restore less.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
