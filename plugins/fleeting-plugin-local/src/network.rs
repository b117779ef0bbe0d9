//! Network namespaces for instances: one namespace + veth pair + /30 subnet each.
//!
//! Crash safety: the instance records its namespace name and subnet index (its `net` file)
//! *before* anything is created, and every step here is idempotent, so a plugin killed half-way
//! leaves pieces that a restarted plugin either reuses ([`ensure`]) or removes ([`remove`]).

use std::net::Ipv4Addr;

use crate::process::{CommandError, run};

/// Number of /30 subnets in 10.213.0.0/16.
const SUBNETS: u32 = 1 << 14;

/// One instance's namespace and link, as persisted in its `net` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netns {
    /// Namespace name (`slw-<short id>`).
    pub name: String,
    /// Subnet index: `10.213.0.0 + 4 * index` / 30; also names the host link `slwh<index>`.
    pub index: u32,
}

impl Netns {
    /// Host side of the veth pair.
    pub fn host_if(&self) -> String {
        format!("slwh{}", self.index)
    }

    /// Address of the host end (`.1` of the /30).
    pub fn host_addr(&self) -> Ipv4Addr {
        subnet_addr(self.index, 1)
    }

    /// Address of the instance (`.2` of the /30).
    pub fn instance_addr(&self) -> Ipv4Addr {
        subnet_addr(self.index, 2)
    }
}

fn subnet_addr(index: u32, host: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 213, 0, 0)) + index * 4 + host)
}

/// Outcome of [`ensure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// Namespace and veth pair exist and are configured.
    Ready,
    /// The host link name for this index belongs to someone else: record a new index from
    /// [`free_index`] and call [`ensure`] again.
    IndexTaken,
}

/// True when `ip netns` works here (root and iproute2 present).
pub async fn available() -> bool {
    run("ip", ["netns", "list"]).await.is_ok()
}

/// The lowest subnet index whose host link does not exist. Only a hint: the index is really
/// claimed by creating the link in [`ensure`] (the kernel refuses a duplicate name), so
/// concurrent groups or test processes never share a subnet.
pub async fn free_index() -> Result<u32, CommandError> {
    let used = existing_host_links().await;
    (0..SUBNETS)
        .find(|i| !used.contains(i))
        .ok_or_else(|| CommandError::other("no free subnet in 10.213.0.0/16"))
}

/// Make sure namespace `ns.name` and a veth pair `slwh<index>` <-> `eth0` into it exist and are
/// configured. Idempotent: pieces left by an interrupted earlier call (or by a plugin killed
/// half-way) are reused; after a reboot everything is made afresh. Never touches a host link
/// that is not this namespace's peer.
pub async fn ensure(ns: &Netns) -> Result<Ensured, CommandError> {
    ensure_namespace(&ns.name).await?;
    match owned_link(ns).await {
        Some(true) => {}
        Some(false) => return Ok(Ensured::IndexTaken),
        None => {
            // An `eth0` in our namespace paired with some other (stale) host link would block
            // the new pair; it is ours, so drop it (its host end goes with it).
            if run("ip", ["-n", &ns.name, "link", "show", "dev", "eth0"])
                .await
                .is_ok()
            {
                run("ip", ["-n", &ns.name, "link", "delete", "eth0"]).await?;
            }
            let host_if = ns.host_if();
            let res = run(
                "ip",
                [
                    "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns",
                    &ns.name,
                ],
            )
            .await;
            match res {
                Ok(_) => {}
                // Lost a race for this index.
                Err(e) if e.to_string().contains("File exists") => {
                    return Ok(Ensured::IndexTaken);
                }
                Err(e) => return Err(e),
            }
        }
    }
    configure(ns).await?;
    Ok(Ensured::Ready)
}

/// Create namespace `name` unless a usable one exists. A namespace file left by an interrupted
/// `ip netns add` (present but not a namespace) is replaced.
async fn ensure_namespace(name: &str) -> Result<(), CommandError> {
    if exists(name).await {
        if usable(name).await {
            return Ok(());
        }
        let _ = run("ip", ["netns", "delete", name]).await;
    }
    match run("ip", ["netns", "add", name]).await {
        Ok(_) => Ok(()),
        Err(_) if usable(name).await => Ok(()),
        Err(e) => Err(e),
    }
}

async fn usable(name: &str) -> bool {
    run("ip", ["-n", name, "link", "show", "dev", "lo"])
        .await
        .is_ok()
}

async fn configure(ns: &Netns) -> Result<(), CommandError> {
    let host_if = ns.host_if();
    let host_cidr = format!("{}/30", ns.host_addr());
    let inst_cidr = format!("{}/30", ns.instance_addr());
    run("ip", ["addr", "replace", &host_cidr, "dev", &host_if]).await?;
    run("ip", ["link", "set", &host_if, "up"]).await?;
    run(
        "ip",
        ["-n", &ns.name, "addr", "replace", &inst_cidr, "dev", "eth0"],
    )
    .await?;
    run("ip", ["-n", &ns.name, "link", "set", "eth0", "up"]).await?;
    run("ip", ["-n", &ns.name, "link", "set", "lo", "up"]).await?;
    Ok(())
}

/// `None` when host link `slwh<index>` does not exist; else whether it is this namespace's veth
/// peer: the `eth0` inside namespace `ns.name` names it as its peer and it names the namespace.
async fn owned_link(ns: &Netns) -> Option<bool> {
    let host_if = ns.host_if();
    let ifindex = tokio::fs::read_to_string(format!("/sys/class/net/{host_if}/ifindex"))
        .await
        .ok()?;
    // Inside: "2: eth0@if94: <...> ..." where 94 is the peer's ifindex on the host.
    let inner = run("ip", ["-n", &ns.name, "-o", "link", "show", "dev", "eth0"])
        .await
        .unwrap_or_default();
    let peer = inner
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.trim_end_matches(':').split_once("@if"))
        .map(|(_, i)| i.to_owned());
    // Outside: "94: slwh0@if2: <...> ... link-netns slw-abcd".
    let outer = run("ip", ["-o", "link", "show", "dev", &host_if])
        .await
        .unwrap_or_default();
    let fields: Vec<&str> = outer.split_whitespace().collect();
    let in_ns = fields
        .windows(2)
        .any(|w| w[0] == "link-netns" && w[1] == ns.name);
    Some(in_ns && peer.as_deref() == Some(ifindex.trim()))
}

/// Delete the veth pair (only if it is this namespace's: a recorded index may since belong to
/// another instance) and the namespace. Missing or half-made pieces are fine; fails only if the
/// namespace is still there afterwards.
pub async fn remove(ns: &Netns) -> Result<(), CommandError> {
    let host_if = ns.host_if();
    if owned_link(ns).await == Some(true)
        && let Err(e) = run("ip", ["link", "delete", &host_if]).await
    {
        // Deleting the namespace below takes the pair with it.
        tracing::warn!(netns = %ns.name, "removing link {host_if}: {e}");
    }
    remove_namespace(&ns.name).await
}

/// Delete namespace `name` (a veth pair into it goes with it); fine if it does not exist.
pub async fn remove_namespace(name: &str) -> Result<(), CommandError> {
    let mut err = None;
    if exists(name).await
        && let Err(e) = run("ip", ["netns", "delete", name]).await
    {
        err = Some(e);
    }
    if exists(name).await {
        return Err(
            err.unwrap_or_else(|| CommandError::other(&format!("namespace {name} still exists")))
        );
    }
    Ok(())
}

/// True when namespace `name` exists (its file under /run/netns; possibly half-made).
pub async fn exists(name: &str) -> bool {
    tokio::fs::try_exists(format!("/run/netns/{name}"))
        .await
        .unwrap_or(false)
}

/// Pids of every process in namespace `name`.
pub async fn pids(name: &str) -> Vec<i32> {
    match run("ip", ["netns", "pids", name]).await {
        Ok(out) => out
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect(),
        Err(_) => Vec::new(),
    }
}

async fn existing_host_links() -> Vec<u32> {
    let mut used = Vec::new();
    if let Ok(mut rd) = tokio::fs::read_dir("/sys/class/net").await {
        while let Ok(Some(entry)) = rd.next_entry().await {
            if let Some(i) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("slwh"))
                .and_then(|n| n.parse().ok())
            {
                used.push(i);
            }
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let ns = Netns {
            name: "slw-x".into(),
            index: 0,
        };
        assert_eq!(ns.host_addr(), Ipv4Addr::new(10, 213, 0, 1));
        assert_eq!(ns.instance_addr(), Ipv4Addr::new(10, 213, 0, 2));
        let ns = Netns {
            name: "slw-x".into(),
            index: SUBNETS - 1,
        };
        assert_eq!(ns.host_if(), "slwh16383");
        assert_eq!(ns.instance_addr(), Ipv4Addr::new(10, 213, 255, 254));
    }
}
