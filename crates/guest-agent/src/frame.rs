//! The wire protocol between the host and the guest agent.
//!
//! One JSON object per `\n`-terminated line in each direction; byte payloads are base64
//! (standard alphabet). Host → guest frames are [`Request`]s tagged by `op`, guest → host frames
//! are [`Reply`]s tagged by `type`. Every frame carries the `id` of the request it belongs to, so
//! many execs multiplex over one stream. A line that does not parse is skipped by both sides:
//! after a snapshot restore or a reconnect half a frame may be in flight, and the next newline
//! resynchronises the stream.

use serde::{Deserialize, Serialize};

/// Protocol version the agent reports in its hello reply.
pub const VERSION: u32 = 1;

/// Largest stdout/stderr payload of one reply frame.
pub const MAX_CHUNK: usize = 32 * 1024;

/// Ops the agent understands (an object with another `op` gets an "unknown op" error).
const KNOWN_OPS: [&str; 5] = ["hello", "exec", "stdin", "signal", "renew"];

/// A frame that cannot be decoded or encoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Not a JSON object with a string `op`/`type`: skipped, the stream resyncs at the next line.
    #[error("not a frame: {0}")]
    Garbage(String),
    /// A well-formed request with an op this agent does not know.
    #[error("unknown op {op:?}")]
    UnknownOp {
        /// The request's id (0 when it has none).
        id: u64,
        /// The op as sent.
        op: String,
    },
    /// A known op with missing or ill-typed fields.
    #[error("invalid {op} request: {source}")]
    Invalid {
        /// The request's id (0 when it has none).
        id: u64,
        /// The op as sent.
        op: String,
        /// What serde found wrong.
        source: serde_json::Error,
    },
    /// Serialisation failed (cannot happen for these types; typed rather than unwrapped).
    #[error("cannot encode frame: {0}")]
    Encode(#[source] serde_json::Error),
}

impl FrameError {
    /// The id of the request this error should be answered to, if the line was a request at all.
    pub fn reply_id(&self) -> Option<u64> {
        match self {
            FrameError::UnknownOp { id, .. } | FrameError::Invalid { id, .. } => Some(*id),
            FrameError::Garbage(_) | FrameError::Encode(_) => None,
        }
    }
}

/// A host → guest frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Liveness check; also carries the host clock so a restored snapshot can fix its own.
    Hello {
        /// Request id.
        id: u64,
        /// Host wall clock, seconds since the epoch.
        unix_time: u64,
    },
    /// Start a process.
    Exec {
        /// Request id; all replies about this process carry it.
        id: u64,
        /// Program and arguments (`argv[0]` is looked up in `PATH`).
        argv: Vec<String>,
        /// Variables added on top of the agent's environment.
        #[serde(default)]
        env: Vec<(String, String)>,
        /// Working directory (the agent's when `None`).
        #[serde(default)]
        cwd: Option<String>,
        /// Bytes written to the process's stdin first.
        #[serde(default, with = "b64_opt")]
        stdin: Option<Vec<u8>>,
        /// Keep stdin open after `stdin` for later [`Request::Stdin`] frames.
        #[serde(default)]
        keep_stdin: bool,
    },
    /// More stdin for an exec started with `keep_stdin`.
    Stdin {
        /// The exec's id.
        id: u64,
        /// Bytes to write.
        #[serde(default, with = "b64_opt")]
        data: Option<Vec<u8>>,
        /// Close stdin after `data`.
        #[serde(default)]
        eof: bool,
    },
    /// Send a signal to an exec's process group.
    Signal {
        /// The exec's id.
        id: u64,
        /// Signal number.
        signal: i32,
    },
    /// Make this guest unique (a restore clones a running kernel): mix `entropy` into the
    /// kernel's RNG and reseed it, and take a new machine-id, hostname and SSH host keys.
    Renew {
        /// Request id.
        id: u64,
        /// Fresh host entropy.
        #[serde(with = "b64")]
        entropy: Vec<u8>,
        /// The new `/etc/machine-id` (32 lowercase hex digits).
        machine_id: String,
        /// The new hostname.
        hostname: String,
    },
}

impl Request {
    /// The request's id.
    pub fn id(&self) -> u64 {
        match self {
            Request::Hello { id, .. }
            | Request::Exec { id, .. }
            | Request::Stdin { id, .. }
            | Request::Signal { id, .. }
            | Request::Renew { id, .. } => *id,
        }
    }

    /// The frame as one `\n`-terminated line.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        encode_line(self)
    }

    /// Parse one line (with or without its `\n`).
    pub fn decode(line: &[u8]) -> Result<Request, FrameError> {
        let value: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| FrameError::Garbage(e.to_string()))?;
        let Some(object) = value.as_object() else {
            return Err(FrameError::Garbage("not a JSON object".into()));
        };
        let Some(op) = object.get("op").and_then(|op| op.as_str()) else {
            return Err(FrameError::Garbage("no string \"op\"".into()));
        };
        let op = op.to_string();
        let id = object.get("id").and_then(|id| id.as_u64()).unwrap_or(0);
        if !KNOWN_OPS.contains(&op.as_str()) {
            return Err(FrameError::UnknownOp { id, op });
        }
        serde_json::from_value(value).map_err(|source| FrameError::Invalid { id, op, source })
    }
}

/// A guest → host frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// Answer to [`Request::Hello`].
    Hello {
        /// The hello's id.
        id: u64,
        /// Protocol version ([`VERSION`]).
        version: u32,
        /// Guest uptime in milliseconds.
        uptime_ms: u64,
    },
    /// The exec's process started.
    Started {
        /// The exec's id.
        id: u64,
        /// Its pid (also its process group id).
        pid: u32,
    },
    /// A chunk of the process's stdout (at most [`MAX_CHUNK`] bytes).
    Stdout {
        /// The exec's id.
        id: u64,
        /// The bytes.
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// A chunk of the process's stderr (at most [`MAX_CHUNK`] bytes).
    Stderr {
        /// The exec's id.
        id: u64,
        /// The bytes.
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// The process exited and its stdout and stderr are drained; the last frame for the id.
    Exit {
        /// The exec's id.
        id: u64,
        /// Exit code, if it exited normally.
        code: Option<i32>,
        /// Terminating signal, if killed by one.
        signal: Option<i32>,
    },
    /// Answer to [`Request::Renew`]: what was renewed, and what could not be.
    Renewed {
        /// The renew's id.
        id: u64,
        /// Whether the kernel's RNG was credited and reseeded (`RNDADDENTROPY`,
        /// `RNDRESEEDCRNG`); else the entropy was only mixed in by a write.
        reseeded: bool,
        /// One line per thing not renewed, and why.
        notes: Vec<String>,
    },
    /// The request failed (an exec that could not start, an unknown op, a malformed request).
    Error {
        /// The request's id (0 when the request had none).
        id: u64,
        /// What went wrong.
        message: String,
    },
}

impl Reply {
    /// The id of the request this reply belongs to.
    pub fn id(&self) -> u64 {
        match self {
            Reply::Hello { id, .. }
            | Reply::Started { id, .. }
            | Reply::Stdout { id, .. }
            | Reply::Stderr { id, .. }
            | Reply::Exit { id, .. }
            | Reply::Renewed { id, .. }
            | Reply::Error { id, .. } => *id,
        }
    }

    /// The frame as one `\n`-terminated line.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        encode_line(self)
    }

    /// Parse one line (with or without its `\n`); anything else is [`FrameError::Garbage`].
    pub fn decode(line: &[u8]) -> Result<Reply, FrameError> {
        serde_json::from_slice(line).map_err(|e| FrameError::Garbage(e.to_string()))
    }
}

fn encode_line<T: Serialize>(frame: &T) -> Result<Vec<u8>, FrameError> {
    let mut line = serde_json::to_vec(frame).map_err(FrameError::Encode)?;
    line.push(b'\n');
    Ok(line)
}

/// Bytes as a base64 string.
mod b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(data))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(D::Error::custom)
    }
}

/// Optional bytes as a base64 string or `null`.
mod b64_opt {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(
        data: &Option<Vec<u8>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match data {
            Some(data) => s.serialize_str(&STANDARD.encode(data)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => STANDARD.decode(text).map(Some).map_err(D::Error::custom),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_request_matches_the_wire_format() {
        let line = br#"{"op":"exec","id":7,"argv":["sh","-c","cat"],"env":[["K","V"]],"cwd":null,"stdin":"aGk=","keep_stdin":false}"#;
        let request = Request::decode(line).unwrap();
        assert_eq!(
            request,
            Request::Exec {
                id: 7,
                argv: vec!["sh".into(), "-c".into(), "cat".into()],
                env: vec![("K".into(), "V".into())],
                cwd: None,
                stdin: Some(b"hi".to_vec()),
                keep_stdin: false,
            }
        );
        let again = Request::decode(&request.encode().unwrap()).unwrap();
        assert_eq!(again, request);
    }

    #[test]
    fn optional_exec_fields_default() {
        let request = Request::decode(br#"{"op":"exec","id":1,"argv":["true"]}"#).unwrap();
        assert_eq!(
            request,
            Request::Exec {
                id: 1,
                argv: vec!["true".into()],
                env: vec![],
                cwd: None,
                stdin: None,
                keep_stdin: false,
            }
        );
    }

    #[test]
    fn replies_encode_as_documented() {
        let stdout = Reply::Stdout {
            id: 3,
            data: b"out\n".to_vec(),
        };
        assert_eq!(
            stdout.encode().unwrap(),
            b"{\"type\":\"stdout\",\"id\":3,\"data\":\"b3V0Cg==\"}\n"
        );
        let exit = Reply::Exit {
            id: 3,
            code: Some(0),
            signal: None,
        };
        assert_eq!(
            exit.encode().unwrap(),
            b"{\"type\":\"exit\",\"id\":3,\"code\":0,\"signal\":null}\n"
        );
        assert_eq!(Reply::decode(&exit.encode().unwrap()).unwrap(), exit);
    }

    #[test]
    fn decode_errors_say_whether_to_answer() {
        let garbage = Request::decode(b"ello\",\"id\":1}").unwrap_err();
        assert_eq!(garbage.reply_id(), None);
        let no_op = Request::decode(br#"{"id":1}"#).unwrap_err();
        assert_eq!(no_op.reply_id(), None);
        let unknown = Request::decode(br#"{"op":"reboot","id":4}"#).unwrap_err();
        assert!(matches!(&unknown, FrameError::UnknownOp { id: 4, op } if op == "reboot"));
        let invalid = Request::decode(br#"{"op":"signal","id":5}"#).unwrap_err();
        assert_eq!(invalid.reply_id(), Some(5));
        let bad_base64 = Request::decode(br#"{"op":"stdin","id":6,"data":"!!"}"#).unwrap_err();
        assert_eq!(bad_base64.reply_id(), Some(6));
    }
}
