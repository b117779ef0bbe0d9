//! Network namespaces for instances: one namespace + veth pair + /30 subnet each.

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

/// True when `ip netns` works here (root and iproute2 present).
pub async fn available() -> bool {
    run("ip", ["netns", "list"]).await.is_ok()
}

/// Create namespace `name` and a veth pair into it, claiming a free subnet index.
///
/// The index is claimed by creating the host link `slwh<index>`: the kernel refuses a duplicate
/// name, so concurrent groups (or test processes) never share a subnet.
pub async fn create(name: &str) -> Result<Netns, CommandError> {
    run("ip", ["netns", "add", name]).await?;
    match claim(name).await {
        Ok(ns) => {
            if let Err(e) = configure(&ns).await {
                remove(&ns).await;
                return Err(e);
            }
            Ok(ns)
        }
        Err(e) => {
            let _ = run("ip", ["netns", "delete", name]).await;
            Err(e)
        }
    }
}

async fn claim(name: &str) -> Result<Netns, CommandError> {
    let used = existing_host_links().await;
    let mut last = None;
    for index in (0..SUBNETS).filter(|i| !used.contains(i)) {
        let ns = Netns {
            name: name.to_owned(),
            index,
        };
        let host_if = ns.host_if();
        let res = run(
            "ip",
            [
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", name,
            ],
        )
        .await;
        match res {
            Ok(_) => return Ok(ns),
            // Lost a race for this index: try the next one.
            Err(e) if e.to_string().contains("File exists") => last = Some(e),
            Err(e) => return Err(e),
        }
        // Bound the retries: many collisions means something else is wrong.
        if index > used.len() as u32 + 64 {
            break;
        }
    }
    Err(last.unwrap_or_else(|| CommandError::other("no free subnet in 10.213.0.0/16")))
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

/// Make sure an instance's namespace and link exist and are configured (after a reboot they
/// are gone while the instance directory remains).
pub async fn ensure(ns: &Netns) -> Result<(), CommandError> {
    if !exists(&ns.name).await {
        run("ip", ["netns", "add", &ns.name]).await?;
    }
    let host_if = ns.host_if();
    if !link_exists(&host_if).await {
        run(
            "ip",
            [
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
            ],
        )
        .await?;
    }
    configure(ns).await
}

/// Delete the veth pair and the namespace; missing pieces are fine.
pub async fn remove(ns: &Netns) {
    let host_if = ns.host_if();
    if link_exists(&host_if).await
        && let Err(e) = run("ip", ["link", "delete", &host_if]).await
    {
        tracing::warn!(netns = %ns.name, "removing link {host_if}: {e}");
    }
    if exists(&ns.name).await
        && let Err(e) = run("ip", ["netns", "delete", &ns.name]).await
    {
        tracing::warn!(netns = %ns.name, "removing namespace: {e}");
    }
}

/// True when namespace `name` exists.
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

async fn link_exists(name: &str) -> bool {
    tokio::fs::try_exists(format!("/sys/class/net/{name}"))
        .await
        .unwrap_or(false)
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
