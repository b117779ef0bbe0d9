//! `slipway-guest-agent`: serves the host over a virtio-serial port, a vsock listener or stdio.
//!
//! Logs one line per event on stderr (the guest console), never process input or output.
//! It does not reap orphans: run it under a shell that does (see the crate docs).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use slipway_guest_agent::frame::VERSION;
use slipway_guest_agent::serve::serve;
use socket2::{Domain, SockAddr, Socket, Type};

/// How long a missing port or vsock transport is waited for at boot.
const APPEAR_LIMIT: Duration = Duration::from_secs(30);

/// Pause between reads of a port whose host side is not connected (reads return EOF then).
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);

/// Any guest CID (`VMADDR_CID_ANY`).
const VMADDR_CID_ANY: u32 = u32::MAX;

const USAGE: &str = "usage: slipway-guest-agent (--port NAME | --vsock PORT | --stdio | --version)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["--version"] => {
            println!(
                "slipway-guest-agent {} (protocol {VERSION})",
                env!("CARGO_PKG_VERSION")
            );
            ExitCode::SUCCESS
        }
        ["--help" | "-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        ["--stdio"] => run_stdio(),
        ["--port", name] => run_port(name),
        ["--vsock", port] => match port.parse() {
            Ok(port) => run_vsock(port),
            Err(e) => {
                log(&format!("bad vsock port {port:?}: {e}"));
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run_stdio() -> ExitCode {
    log("serving stdio");
    match serve(std::io::stdin().lock(), std::io::stdout()) {
        Ok(summary) => {
            log(&format!("stdin closed after {summary:?}"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            log(&format!("cannot read stdin: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// Serve a virtio-serial port forever: the host connects and disconnects many times.
fn run_port(name: &str) -> ExitCode {
    let Some(device) = wait_for(APPEAR_LIMIT, || find_port(name)) else {
        log(&format!(
            "no virtio-serial port named {name:?} after {APPEAR_LIMIT:?}"
        ));
        return ExitCode::FAILURE;
    };
    log(&format!("serving port {name:?} on {}", device.display()));
    let mut open_failed = false;
    loop {
        let port = match OpenOptions::new().read(true).write(true).open(&device) {
            Ok(port) => {
                open_failed = false;
                port
            }
            Err(e) => {
                // Logged once per outage: the console is not for a line every second.
                if !open_failed {
                    log(&format!("cannot open {}: {e}", device.display()));
                    open_failed = true;
                }
                thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        if let Err(e) = serve_port(&port) {
            log(&format!("port {}: {e}; reopening", device.display()));
            drop(port);
            thread::sleep(RECONNECT_PAUSE);
        }
    }
}

/// Sessions on one open port until a read or dup fails.
fn serve_port(port: &File) -> std::io::Result<()> {
    loop {
        // Each session gets its own descriptors; the session drops them when it ends.
        let summary = serve(port.try_clone()?, port.try_clone()?)?;
        if summary.frames + summary.skipped > 0 {
            log(&format!("host disconnected after {summary:?}"));
        }
        // While no host is connected a read returns EOF at once: poll gently.
        thread::sleep(RECONNECT_PAUSE);
    }
}

/// `/dev` path of the virtio-serial port named `name`.
fn find_port(name: &str) -> Option<PathBuf> {
    let by_name = Path::new("/dev/virtio-ports").join(name);
    if by_name.exists() {
        return Some(by_name);
    }
    for entry in std::fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let matches = std::fs::read_to_string(entry.path().join("name"))
            .is_ok_and(|found| found.trim_end() == name);
        let device = Path::new("/dev").join(entry.file_name());
        if matches && device.exists() {
            return Some(device);
        }
    }
    None
}

/// Listen on vsock `port` forever, one thread per connection.
fn run_vsock(port: u32) -> ExitCode {
    let mut failures = 0u32;
    let Some(listener) = wait_for(APPEAR_LIMIT, || match listen_vsock(port) {
        Ok(listener) => Some(listener),
        Err(e) => {
            // The first failure and then one every 5 s: the transport may load late.
            if failures.is_multiple_of(50) {
                log(&format!("cannot listen on vsock port {port}: {e}"));
            }
            failures += 1;
            None
        }
    }) else {
        return ExitCode::FAILURE;
    };
    log(&format!("listening on vsock port {port}"));
    loop {
        let (connection, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) => {
                log(&format!("vsock accept: {e}"));
                thread::sleep(RECONNECT_PAUSE);
                continue;
            }
        };
        let peer = peer
            .as_vsock_address()
            .map_or_else(|| "?".to_string(), |(cid, port)| format!("{cid}:{port}"));
        log(&format!("vsock connection from {peer}"));
        let name = format!("vsock-{peer}");
        let spawned = thread::Builder::new().name(name.clone()).spawn(move || {
            let result = connection
                .try_clone()
                .and_then(|reader| serve(reader, connection));
            match result {
                Ok(summary) => log(&format!("vsock {peer} closed after {summary:?}")),
                Err(e) => log(&format!("vsock {peer}: {e}")),
            }
        });
        if let Err(e) = spawned {
            log(&format!("cannot start {name}: {e}"));
        }
    }
}

fn listen_vsock(port: u32) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::VSOCK, Type::STREAM, None)?;
    socket.bind(&SockAddr::vsock(VMADDR_CID_ANY, port))?;
    socket.listen(16)?;
    Ok(socket)
}

/// Poll `probe` every 100 ms until it gives a value or `limit` passes.
fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = probe() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn log(message: &str) {
    eprintln!("slipway-guest-agent: {message}");
}
