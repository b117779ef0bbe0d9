//! The helper's stages against a real HTTP server on loopback: a dependency is downloaded with
//! its job token and unpacked, an archive past the limits is refused and leaves the project
//! and scratch directories as they were, a missing one fails the stage, and collected files are
//! archived and uploaded as GitLab's multipart form.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use slipway_helper::{Ending, Stage};
use slipway_job::data::{ArchiveLimits, DataPlan, DataStep};

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// A server answering every request with `status` and `body`; what it was sent.
fn serve(status: u16, body: Vec<u8>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (method, path) = (
                parts.next().unwrap_or_default().to_string(),
                parts.next().unwrap_or_default().to_string(),
            );
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                }
            }
            let chunked = headers
                .iter()
                .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
            let got = if chunked {
                read_chunked(&mut reader)
            } else {
                let len = headers
                    .iter()
                    .find(|(k, _)| k == "content-length")
                    .and_then(|(_, v)| v.parse::<usize>().ok())
                    .unwrap_or(0);
                let mut got = vec![0; len];
                let _ = reader.read_exact(&mut got);
                got
            };
            log.lock().unwrap().push(Seen {
                method,
                path,
                headers,
                body: got,
            });
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (url, seen)
}

/// A `Transfer-Encoding: chunked` body, decoded (what it holds up to a broken chunk).
fn read_chunked(reader: &mut impl BufRead) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        if reader.read_line(&mut size).is_err() {
            return body;
        }
        let hex = size.trim().split(';').next().unwrap_or_default();
        let Ok(len) = usize::from_str_radix(hex, 16) else {
            return body;
        };
        if len == 0 {
            let mut end = String::new();
            let _ = reader.read_line(&mut end);
            return body;
        }
        let mut chunk = vec![0; len + 2];
        if reader.read_exact(&mut chunk).is_err() {
            return body;
        }
        body.extend_from_slice(&chunk[..len]);
    }
}

/// A zip of `files` (name, contents), deflated.
fn zip_of(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    let mut zip = zip::ZipWriter::new(&mut out);
    for (name, data) in files {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file(*name, opts).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap();
    out.into_inner()
}

fn download(url: &str) -> DataStep {
    DataStep::Download {
        name: "build".into(),
        id: 7,
        url: format!("{url}/api/v4/jobs/7/artifacts"),
        token: "glcbt-1_depToken".into(),
        attempts: 1,
    }
}

/// Run `plan` in fresh project and scratch directories: how it ended, what it said, and the
/// two directories.
fn run(plan: &DataPlan) -> (Ending, String, tempfile::TempDir, tempfile::TempDir) {
    let (project, scratch) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut out = Vec::new();
    let ending = Stage {
        project: project.path(),
        scratch: scratch.path(),
        out: &mut out,
    }
    .run(plan);
    (
        ending,
        String::from_utf8_lossy(&out).into_owned(),
        project,
        scratch,
    )
}

fn entries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn a_dependency_is_downloaded_with_its_token_and_unpacked() {
    let (url, seen) = serve(200, zip_of(&[("out/app.txt", b"built\n".to_vec())]));
    let plan = DataPlan {
        limits: ArchiveLimits {
            max_size: 1 << 20,
            max_entries: 100,
            max_ratio: 200,
        },
        steps: vec![download(&url)],
        ..DataPlan::default()
    };
    let (ending, said, project, scratch) = run(&plan);
    assert_eq!(ending, Ending::Done, "{said}");
    assert_eq!(
        std::fs::read(project.path().join("out/app.txt")).unwrap(),
        b"built\n"
    );
    assert_eq!(entries(scratch.path()), 0, "the scratch files are gone");
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].path, "/api/v4/jobs/7/artifacts");
    assert!(
        seen[0]
            .headers
            .contains(&("job-token".into(), "glcbt-1_depToken".into()))
    );
    assert!(
        said.contains("Downloading artifacts for build (7)..."),
        "{said}"
    );
    assert!(!said.contains("glcbt-1_depToken"), "{said}");
}

#[test]
fn an_archive_past_the_limits_is_refused_and_leaves_both_directories_as_they_were() {
    let (url, _) = serve(200, zip_of(&[("big/zeros.bin", vec![0; 4 << 20])]));
    let plan = DataPlan {
        limits: ArchiveLimits {
            max_size: 1 << 20,
            max_entries: 100,
            max_ratio: 200,
        },
        steps: vec![download(&url)],
        ..DataPlan::default()
    };
    let (ending, said, project, scratch) = run(&plan);
    assert_eq!(ending, Ending::Refused, "{said}");
    assert!(
        said.contains("max_size") && said.contains("refused"),
        "{said}"
    );
    assert_eq!(entries(project.path()), 0, "nothing reached the project");
    assert_eq!(entries(scratch.path()), 0, "nothing is left in the scratch");
}

#[test]
fn a_missing_dependency_fails_the_stage() {
    let (url, _) = serve(404, b"{\"message\":\"404 Not Found\"}".to_vec());
    let plan = DataPlan {
        steps: vec![download(&url)],
        ..DataPlan::default()
    };
    let (ending, said, _, _) = run(&plan);
    assert_eq!(ending, Ending::Failed, "{said}");
    assert!(said.contains("404 Not Found"), "{said}");
}

#[test]
fn collected_files_are_archived_and_posted_as_gitlab_s_form() {
    let (url, seen) = serve(201, Vec::new());
    let (project, scratch) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // What the stage script collects: a tar of the artifact's paths.
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(3);
    header.set_mode(0o644);
    tar.append_data(&mut header, "out/a.txt", &b"abc"[..])
        .unwrap();
    std::fs::write(scratch.path().join("c0.tar"), tar.into_inner().unwrap()).unwrap();
    let plan = DataPlan {
        steps: vec![DataStep::Upload {
            job_id: 9,
            succeeded: true,
            url: format!("{url}/api/v4/jobs/9/artifacts?artifact_format=zip&artifact_type=archive"),
            token: "glcbt-1_jobToken".into(),
            artifact_type: "archive".into(),
            artifact_format: "zip".into(),
            name: Some("app".into()),
            expire_in: None,
            compression: String::new(),
            paths: vec!["out".into()],
            exclude: Vec::new(),
            untracked: false,
            tar: "c0.tar".into(),
        }],
        ..DataPlan::default()
    };
    let mut out = Vec::new();
    let ending = Stage {
        project: project.path(),
        scratch: scratch.path(),
        out: &mut out,
    }
    .run(&plan);
    let said = String::from_utf8_lossy(&out);
    assert_eq!(ending, Ending::Done, "{said}");
    let seen = seen.lock().unwrap();
    let post = &seen[0];
    assert_eq!(post.method, "POST");
    assert!(
        post.headers
            .contains(&("job-token".into(), "glcbt-1_jobToken".into()))
    );
    // Streamed as it is made, as GitLab Runner sends it: no archive on the host's disk.
    assert!(
        post.headers
            .contains(&("transfer-encoding".into(), "chunked".into())),
        "{:?}",
        post.headers
    );
    let body = String::from_utf8_lossy(&post.body);
    assert!(body.contains("filename=\"app.zip\""), "{body}");
    assert!(
        body.contains("name=\"artifact_type\"\r\n\r\narchive"),
        "{body}"
    );
    // The zip is GitLab Runner's: the file is in it.
    let boundary = post
        .headers
        .iter()
        .find(|(k, _)| k == "content-type")
        .and_then(|(_, v)| v.split("boundary=").nth(1))
        .unwrap()
        .to_string();
    let tail = format!("\r\n--{boundary}--");
    let start = post
        .body
        .windows(4)
        .position(|w| w == b"PK\x03\x04")
        .unwrap();
    let end = post
        .body
        .windows(tail.len())
        .rposition(|w| w == tail.as_bytes())
        .unwrap();
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(post.body[start..end].to_vec()))
        .expect("a zip in the form");
    let mut a = String::new();
    zip.by_name("out/a.txt")
        .unwrap()
        .read_to_string(&mut a)
        .unwrap();
    assert_eq!(a, "abc");
}
