//! Fleeting plugin replies over the wire: the real plugin host (`slipway_fleeting::PluginHost`)
//! starts a fake plugin process (`slipway-fuzz-plugin`: the real go-plugin handshake, then
//! random well-framed replies and random gRPC statuses), makes a sequence of calls, and stops
//! it. Every call returns (a value or an error, never a panic) and the process is gone after
//! `stop`.

use std::path::Path;
use std::time::{Duration, Instant};

use slipway_fleeting::host::PluginOptions;
use slipway_fleeting::{ConnectorConfig, InstanceGroup, PluginHost};

/// The input: the plugin's random seed and the calls to make (each byte picks one).
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub struct Input {
    /// Seed of the plugin's replies.
    pub seed: u64,
    /// Calls: init, update, increase, decrease, connect_info, heartbeat, shutdown.
    pub calls: Vec<u8>,
}

/// Runs one plugin process with `bin` (the `slipway-fuzz-plugin` executable).
pub fn check(bin: &Path, input: &Input) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(run(bin, input));
}

async fn run(bin: &Path, input: &Input) {
    let mut opts = PluginOptions::new("fuzz", bin);
    opts.process.env = vec![("SLIPWAY_FUZZ_PLUGIN_SEED".into(), input.seed.to_string())];
    opts.process.max_restarts = 1;
    opts.process.handshake_timeout = Duration::from_secs(20);
    let host = PluginHost::start(opts)
        .await
        .expect("the fake plugin completes the handshake");
    let pid = host.pid();
    for c in input.calls.iter().take(12) {
        let _ = match c % 7 {
            0 => host
                .init(b"{}", &ConnectorConfig::default())
                .await
                .map(|i| i.id.len()),
            1 => host.update().await.map(|v| v.len()),
            2 => host.increase(u32::from(*c)).await.map(|n| n as usize),
            3 => host.decrease(&["i-1".to_string()]).await.map(|v| v.len()),
            4 => host.connect_info("i-1").await.map(|c| c.id.len()),
            5 => host.heartbeat("i-1").await.map(|()| 0),
            _ => host.shutdown().await.map(|()| 0),
        };
    }
    host.stop().await;
    if let Some(pid) = pid {
        let proc = format!("/proc/{pid}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while gone_or_zombie(&proc).is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            gone_or_zombie(&proc).is_some(),
            "the plugin process {pid} is still running after stop"
        );
    }
}

/// `Some` when the process is gone (or a zombie of ours, reaped later).
fn gone_or_zombie(proc: &str) -> Option<()> {
    match std::fs::read_to_string(format!("{proc}/stat")) {
        Err(_) => Some(()),
        Ok(stat) => {
            let state = stat.rsplit(')').next()?.split_whitespace().next()?;
            (state == "Z" || state == "X").then_some(())
        }
    }
}
