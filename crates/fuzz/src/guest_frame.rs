//! The guest agent's frames (`slipway_guest_agent::frame`): `Request::decode`, `Reply::decode`,
//! and the encode → decode round trip of whatever decodes.

use slipway_guest_agent::frame::{Reply, Request};

use crate::mutate::{self, Mutated};

/// The input: a seed frame and edits, or raw bytes.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub enum Input {
    /// A seed frame mutated.
    Mutated(Mutated),
    /// Any bytes.
    Raw(Vec<u8>),
}

const SEEDS: &[&[u8]] = &[
    br#"{"op":"hello","id":1,"unix_time":1700000000}"#,
    br#"{"op":"exec","id":2,"argv":["sh","-c","echo hi"],"env":[["A","b"]],"cwd":"/","stdin":true}"#,
    br#"{"op":"stdin","id":2,"data":"aGk="}"#,
    br#"{"op":"signal","id":2,"signal":15}"#,
    br#"{"type":"hello","id":1,"version":1}"#,
    br#"{"type":"stdout","id":2,"data":"aGk="}"#,
    br#"{"type":"exit","id":2,"code":0}"#,
    br#"{"type":"error","id":2,"message":"no"}"#,
];

const DICT: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "null",
    "-1",
    "1e400",
    "18446744073709551616",
    "\"op\":",
    "\"type\":",
    "\"id\":",
    "\"data\":",
    "\"argv\":",
    "\"exec\"",
    "\"stdin\"",
    "\"exit\"",
    "\"hello\"",
    "\"signal\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"!!!\"",
    "\n",
];

/// Decoding never panics; a decoded frame encodes to one `\n`-terminated line that decodes back
/// to the same frame.
pub fn check(input: &Input) {
    let bytes = match input {
        Input::Mutated(m) => mutate::apply(SEEDS, DICT, m),
        Input::Raw(b) => b.clone(),
    };
    check_line(&bytes);
}

/// One line, both directions.
pub fn check_line(line: &[u8]) {
    match Request::decode(line) {
        Ok(req) => {
            let enc = req.encode().expect("a decoded request encodes");
            assert!(enc.ends_with(b"\n") && !enc[..enc.len() - 1].contains(&b'\n'));
            assert_eq!(Request::decode(&enc).expect("round trip"), req);
        }
        Err(e) => {
            let _ = (e.reply_id(), e.to_string());
        }
    }
    match Reply::decode(line) {
        Ok(rep) => {
            let enc = rep.encode().expect("a decoded reply encodes");
            assert!(enc.ends_with(b"\n") && !enc[..enc.len() - 1].contains(&b'\n'));
            assert_eq!(Reply::decode(&enc).expect("round trip"), rep);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
