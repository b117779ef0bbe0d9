//! The slot operations as bash snippets, for instances reached over SSH.
//!
//! Each function returns script text (pure, no I/O here). The scripts detect the remote
//! host's layout themselves — unified, hybrid or legacy, exactly as
//! [`Hierarchy::at`](crate::Hierarchy::at) does — and mirror [`SlotCgroup`](crate::SlotCgroup):
//! same directories, same files, same values, same kill-then-remove order.
//!
//! Every snippet is one subshell `( … )`, so it leaves the caller's variables and shell options
//! alone and can be run standalone (`bash -c`, `bash -s` over SSH) or pasted into a larger
//! script. Its exit status is 0 on success; errors go to stderr prefixed `slipway-cgroup:`.
//!
//! The snippets need bash (3.1 or later: `printf -v`, arrays, `${!name}`), not just a POSIX
//! `sh`: the executor runs every script with bash, and the cgroup level is never used inside a
//! container. They are on the path to a job's first output line — [`create`] runs before the
//! job and [`enter`] at the start of every step — so those two spawn no process beyond the
//! subshell itself, except one `mkdir -p` for all the slot's directories (and the cleanup of a
//! stale slot, when there is one): no `$( … )`, no `cat`, hierarchy detection once per script.
//! [`cleanup`] and [`sweep`] print one line per slot cleaned on stdout, which
//! [`parse_oom_kills`] reads.

use std::fmt::Write as _;
use std::time::Duration;

use crate::error::{CgroupError, Result};
use crate::hierarchy::Hierarchy;
use crate::limits::{CpuQuota, Limits};
use crate::template::{SlotPath, SlotTemplate};

/// How long [`SlotCgroup::create`](crate::SlotCgroup::create) spends cleaning a stale slot left by a crashed run.
pub const DEFAULT_CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Start of the line [`cleanup`] and [`sweep`] print for each slot cleaned:
/// `slipway-cgroup: cleaned <path> oom_kills=<n>`.
pub const REPORT_PREFIX: &str = "slipway-cgroup: cleaned ";

/// Pause between kill or rmdir rounds in the scripts, ms.
const ROUND_MS: u128 = 50;

/// An absolute cgroup root on the remote host, checked safe to embed in a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptRoot(String);

impl ScriptRoot {
    /// Validate `root`: absolute, letters, digits and `/._-@:+=` only.
    pub fn new(root: &str) -> Result<Self> {
        let err = |reason| CgroupError::InvalidRoot {
            root: root.to_string(),
            reason,
        };
        if !root.starts_with('/') {
            return Err(err("must be absolute"));
        }
        if !root
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-@:+=".contains(c))
        {
            return Err(err("only letters, digits and /._-@:+= are allowed"));
        }
        let trimmed = root.trim_end_matches('/');
        Ok(Self(if trimmed.is_empty() {
            "/".into()
        } else {
            trimmed.into()
        }))
    }

    /// The root path.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for ScriptRoot {
    fn default() -> Self {
        Self(Hierarchy::DEFAULT_ROOT.into())
    }
}

/// Quote a string for bash as one single-quoted word.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A script that creates the slot with `limits`, cleaning a stale one first (like
/// [`SlotCgroup::create`](crate::SlotCgroup::create)). Fails on invalid limits.
pub fn create(root: &ScriptRoot, path: &SlotPath, limits: &Limits) -> Result<String> {
    limits.validate()?;
    let mut body = String::new();
    body.push_str(BASE);
    body.push_str(CLEANUP);
    body.push_str(MAKE);
    body.push_str("_sw_detect || exit 1\n");
    for (set, controller) in [
        (limits.cpu.is_some(), "cpu"),
        (limits.memory_bytes.is_some(), "memory"),
        (limits.pids.is_some(), "pids"),
    ] {
        if set {
            let _ = writeln!(body, "_sw_need {controller} || exit 1");
        }
    }
    let rounds = rounds(DEFAULT_CLEANUP_TIMEOUT);
    let _ = writeln!(
        body,
        "if _sw_exists; then _sw_cleanup {rounds} {} >/dev/null || exit 1; fi",
        quote(&format!("{DEFAULT_CLEANUP_TIMEOUT:?}"))
    );
    body.push_str("_sw_limits() {\n");
    body.push_str(
        "  _sw_backend memory\n  if [ \"$_sw_kind\" = v2 ]; then \
         _sw_write \"$_sw_mnt/$_sw_path/memory.oom.group\" 1 || return 1; fi\n",
    );
    if let Some(cpus) = limits.cpu {
        let q = CpuQuota::from_cpus(cpus);
        let _ = write!(
            body,
            "  _sw_backend cpu\n  case \"$_sw_kind\" in\n    \
             v2) _sw_write \"$_sw_mnt/$_sw_path/cpu.max\" '{max}' || return 1 ;;\n    \
             v1) _sw_write \"$_sw_mnt/$_sw_path/cpu.cfs_period_us\" {period} || return 1\n        \
             _sw_write \"$_sw_mnt/$_sw_path/cpu.cfs_quota_us\" {quota} || return 1 ;;\n  esac\n",
            max = q.cpu_max(),
            period = q.period_us,
            quota = q.quota_us,
        );
    }
    if let Some(bytes) = limits.memory_bytes {
        let _ = write!(
            body,
            "  _sw_backend memory\n  case \"$_sw_kind\" in\n    \
             v2) _sw_write \"$_sw_mnt/$_sw_path/memory.max\" {bytes} || return 1\n        \
             if [ -f \"$_sw_mnt/$_sw_path/memory.swap.max\" ]; then \
             _sw_write \"$_sw_mnt/$_sw_path/memory.swap.max\" 0 || return 1; fi ;;\n    \
             v1) _sw_write \"$_sw_mnt/$_sw_path/memory.limit_in_bytes\" {bytes} || return 1\n        \
             if [ -f \"$_sw_mnt/memory.memsw.limit_in_bytes\" ]; then \
             _sw_write \"$_sw_mnt/$_sw_path/memory.memsw.limit_in_bytes\" {bytes} || return 1; fi ;;\n  \
             esac\n",
        );
    }
    if let Some(pids) = limits.pids {
        let _ = write!(
            body,
            "  _sw_backend pids\n  _sw_write \"$_sw_mnt/$_sw_path/pids.max\" {pids} || return 1\n",
        );
    }
    body.push_str("  return 0\n}\n");
    body.push_str("if ! { _sw_make && _sw_limits; }; then _sw_remove 20; exit 1; fi\n");
    Ok(wrap(root, path.as_str(), &body, ""))
}

/// A prologue that moves the running shell (`$$`) into the slot in every mount, or exits the
/// script with an error message if it cannot. Paste it at the top of a job's step script.
pub fn enter(root: &ScriptRoot, path: &SlotPath) -> String {
    let mut body = String::new();
    body.push_str(BASE);
    body.push_str(
        "_sw_detect || exit 1\n\
         for _sw_d in $_sw_dirs; do _sw_write \"$_sw_d/cgroup.procs\" \"$$\" || exit 1; done\n",
    );
    wrap(root, path.as_str(), &body, " || exit 1")
}

/// A script that kills everything in the slot (`cgroup.kill`, then freeze / SIGKILL / thaw
/// rounds until empty), removes its directories children first and prints
/// `slipway-cgroup: cleaned <path> oom_kills=<n>`. A missing slot is fine (n = 0).
pub fn cleanup(root: &ScriptRoot, path: &SlotPath, timeout: Duration) -> String {
    let mut body = String::new();
    body.push_str(BASE);
    body.push_str(CLEANUP);
    let _ = writeln!(
        body,
        "_sw_detect || exit 1\n_sw_cleanup {} {} || exit 1",
        rounds(timeout),
        quote(&format!("{timeout:?}"))
    );
    wrap(root, path.as_str(), &body, "")
}

/// A script that cleans up every slot of `template` whose number is not in `keep`, like
/// [`sweep`](crate::sweep), printing one report line per slot.
pub fn sweep(
    root: &ScriptRoot,
    template: &SlotTemplate,
    keep: &[u32],
    timeout: Duration,
) -> String {
    let mut body = String::new();
    body.push_str(BASE);
    body.push_str(CLEANUP);
    body.push_str("_sw_detect || exit 1\n");
    let timeout_args = format!("{} {}", rounds(timeout), quote(&format!("{timeout:?}")));
    match template.slot_component() {
        None => {
            if keep.is_empty() {
                let _ = writeln!(body, "_sw_cleanup {timeout_args} || exit 1");
            }
            return wrap(root, template.as_str(), &body, "");
        }
        Some((parent, prefix, suffix)) => {
            let keep: String = keep.iter().map(|k| format!("{k} ")).collect();
            let _ = write!(
                body,
                "_sw_parent={parent}; _sw_pre={prefix}; _sw_suf={suffix}; _sw_keep={keep}\n{SWEEP}",
                parent = quote(&parent),
                prefix = quote(&prefix),
                suffix = quote(&suffix),
                keep = quote(&format!(" {keep}")),
            );
            let _ = writeln!(
                body,
                "_sw_rc=0\nfor _sw_n in $_sw_found; do\n  \
                 _sw_setpath \"${{_sw_parent:+$_sw_parent/}}$_sw_pre$_sw_n$_sw_suf\"\n  \
                 _sw_cleanup {timeout_args} || _sw_rc=1\ndone\nexit $_sw_rc"
            );
        }
    }
    wrap(root, "", &body, "")
}

/// The OOM-kill count from the output of a [`cleanup`] script (the first report line).
pub fn parse_oom_kills(output: &str) -> Option<u64> {
    output.lines().find_map(|line| {
        let rest = line.trim().strip_prefix(REPORT_PREFIX)?;
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix("oom_kills="))?
            .parse()
            .ok()
    })
}

fn rounds(timeout: Duration) -> u128 {
    timeout.as_millis().div_ceil(ROUND_MS).max(1)
}

fn wrap(root: &ScriptRoot, path: &str, body: &str, after: &str) -> String {
    format!(
        "(\nset +e +u; set +o pipefail 2>/dev/null\n_sw_root={}\n_sw_path={}\n{body}){after}\n",
        quote(root.as_str()),
        quote(path),
    )
}

/// Detection and writes: sets `_sw_unified` (cgroup2 mount or empty), `_sw_v2c` (its
/// controllers), `_sw_mounts` (distinct v1 mounts), `_sw_v1_<controller>` (each v1
/// controller's mount, resolved once) and `_sw_dirs` (the slot in every mount).
///
/// Detection and `_sw_backend` use bash builtins only (`cd -P` and `$PWD` instead of
/// `$(cd -P … && pwd)`, `read` instead of `$(cat …)`): no process is spawned, since a fork
/// costs more than all the rest of the prologue that every step runs.
const BASE: &str = r#"_sw_err() { echo "slipway-cgroup: $*" >&2; }
_sw_write() {
  if ! printf '%s' "$2" > "$1"; then _sw_err "cannot write $2 to $1"; return 1; fi
}
_sw_setpath() {
  _sw_path=$1; _sw_dirs=
  if [ -n "$_sw_unified" ]; then _sw_dirs=$_sw_unified/$_sw_path; fi
  for _sw_m in $_sw_mounts; do _sw_dirs="$_sw_dirs $_sw_m/$_sw_path"; done
  return 0
}
_sw_detect() {
  _sw_unified=; _sw_v2c=; _sw_mounts=
  _sw_v1_cpu=; _sw_v1_cpuacct=; _sw_v1_memory=; _sw_v1_pids=; _sw_v1_freezer=
  if [ -f "$_sw_root/cgroup.controllers" ]; then
    _sw_unified=$_sw_root
  else
    for _sw_c in cpu cpuacct memory pids freezer; do
      if [ -f "$_sw_root/$_sw_c/cgroup.procs" ]; then
        cd -P "$_sw_root/$_sw_c" || return 1
        _sw_m=$PWD
        printf -v "_sw_v1_$_sw_c" '%s' "$_sw_m"
        case " $_sw_mounts " in *" $_sw_m "*) ;; *) _sw_mounts="$_sw_mounts $_sw_m" ;; esac
      fi
    done
    cd / || return 1
    if [ -f "$_sw_root/unified/cgroup.controllers" ]; then _sw_unified=$_sw_root/unified; fi
  fi
  if [ -n "$_sw_unified" ]; then
    read -r -d '' _sw_v2c < "$_sw_unified/cgroup.controllers"
    _sw_v2c=" $_sw_v2c "
  fi
  if [ -z "$_sw_unified$_sw_mounts" ]; then
    _sw_err "no cgroup hierarchy found under $_sw_root"; return 1
  fi
  _sw_setpath "$_sw_path"
}
_sw_backend() {
  _sw_kind=; _sw_mnt=
  case "$1" in
    cpu|cpuacct|memory|pids|freezer) _sw_mnt=_sw_v1_$1; _sw_mnt=${!_sw_mnt} ;;
  esac
  if [ -n "$_sw_mnt" ]; then
    _sw_kind=v1
  elif [ -n "$_sw_unified" ]; then
    case "$1" in
      cpuacct|freezer) _sw_kind=v2 ;;
      *) case "$_sw_v2c" in *" $1 "*) _sw_kind=v2 ;; esac ;;
    esac
    if [ -n "$_sw_kind" ]; then _sw_mnt=$_sw_unified; fi
  fi
  return 0
}
"#;

/// Kill, remove and report.
const CLEANUP: &str = r#"_sw_exists() {
  for _sw_d in $_sw_dirs; do if [ -d "$_sw_d" ]; then return 0; fi; done
  return 1
}
_sw_pids() {
  for _sw_d in $_sw_dirs; do
    if [ -d "$_sw_d" ]; then find "$_sw_d" -name cgroup.procs -exec cat {} + 2>/dev/null; fi
  done | sort -un
}
_sw_self() {
  for _sw_x in $1; do
    if [ "$_sw_x" = "$$" ]; then
      _sw_err "refusing to clean up $_sw_path: it holds this shell (pid $$)"; return 0
    fi
  done
  return 1
}
_sw_freeze() {
  _sw_backend freezer
  _sw_fd=$_sw_mnt/$_sw_path
  case "$_sw_kind:$1" in
    v1:1) _sw_ff=$_sw_fd/freezer.state; _sw_fv=FROZEN ;;
    v1:0) _sw_ff=$_sw_fd/freezer.state; _sw_fv=THAWED ;;
    v2:*) _sw_ff=$_sw_fd/cgroup.freeze; _sw_fv=$1 ;;
    *) return 1 ;;
  esac
  if [ ! -f "$_sw_ff" ]; then return 1; fi
  printf '%s' "$_sw_fv" 2>/dev/null > "$_sw_ff" || return 1
  if [ "$1" = 1 ]; then
    _sw_j=0
    while [ "$_sw_j" -lt 50 ]; do
      if [ "$_sw_kind" = v1 ]; then
        if [ "$(cat "$_sw_ff" 2>/dev/null)" = FROZEN ]; then break; fi
      else
        _sw_fz=
        while read -r _sw_k _sw_v; do
          if [ "$_sw_k $_sw_v" = "frozen 1" ]; then _sw_fz=1; fi
        done < "$_sw_fd/cgroup.events"
        if [ -n "$_sw_fz" ]; then break; fi
      fi
      sleep 0.01; _sw_j=$((_sw_j + 1))
    done
  fi
  return 0
}
_sw_kill() {
  _sw_p=$(_sw_pids)
  if _sw_self "$_sw_p"; then return 1; fi
  if [ -n "$_sw_unified" ] && [ -f "$_sw_unified/$_sw_path/cgroup.kill" ]; then
    printf 1 2>/dev/null > "$_sw_unified/$_sw_path/cgroup.kill"
  fi
  _sw_i=0
  while :; do
    _sw_p=$(_sw_pids)
    if [ -z "$_sw_p" ]; then return 0; fi
    if _sw_self "$_sw_p"; then return 1; fi
    if [ "$_sw_i" -ge "$1" ]; then
      _sw_err "processes" $_sw_p "still in $_sw_path after $2"; return 1
    fi
    if _sw_freeze 1; then
      kill -9 $_sw_p 2>/dev/null
      _sw_freeze 0
    else
      kill -9 $_sw_p 2>/dev/null
    fi
    sleep 0.05; _sw_i=$((_sw_i + 1))
  done
}
_sw_remove() {
  _sw_i=0
  while :; do
    _sw_left=
    for _sw_d in $_sw_dirs; do
      if [ -d "$_sw_d" ]; then find "$_sw_d" -depth -type d -exec rmdir {} \; 2>/dev/null; fi
      if [ -d "$_sw_d" ]; then _sw_left="$_sw_left $_sw_d"; fi
    done
    if [ -z "$_sw_left" ]; then return 0; fi
    if [ "$_sw_i" -ge "$1" ]; then _sw_err "cannot remove cgroup$_sw_left"; return 1; fi
    sleep 0.05; _sw_i=$((_sw_i + 1))
  done
}
_sw_oom() {
  _sw_oom=0
  _sw_backend memory
  case "$_sw_kind" in
    v2) _sw_f=$_sw_mnt/$_sw_path/memory.events ;;
    v1) _sw_f=$_sw_mnt/$_sw_path/memory.oom_control ;;
    *) return 0 ;;
  esac
  if [ -f "$_sw_f" ]; then
    while read -r _sw_k _sw_v; do
      if [ "$_sw_k" = oom_kill ]; then _sw_oom=$_sw_v; fi
    done < "$_sw_f"
  fi
  return 0
}
_sw_cleanup() {
  _sw_oom
  if _sw_exists; then
    _sw_kill "$1" "$2" || return 1
    _sw_remove "$1" || return 1
  fi
  echo "slipway-cgroup: cleaned $_sw_path oom_kills=$_sw_oom"
}
"#;

/// Directory creation with v2 controller delegation along the path. Every directory that can
/// be made at once is made by one `mkdir -p` (the only process the create script spawns when
/// no stale slot is in the way); only a v2 parent that must exist before controllers are
/// enabled in it is made on its own. If that `mkdir -p` fails, the directories are made one
/// by one again, as before, for the error message naming the one that cannot be created.
const MAKE: &str = r#"_sw_need() {
  _sw_backend "$1"
  if [ -z "$_sw_kind" ]; then
    _sw_err "cannot limit $1: controller $1 is not available under $_sw_root"; return 1
  fi
  return 0
}
_sw_enable() {
  _sw_have=
  read -r -d '' _sw_have 2>/dev/null < "$1/cgroup.subtree_control"
  _sw_have=" $_sw_have "
  _sw_add=
  for _sw_w in $_sw_want; do
    case "$_sw_have" in *" $_sw_w "*) ;; *) _sw_add="$_sw_add +$_sw_w" ;; esac
  done
  if [ -n "$_sw_add" ]; then _sw_write "$1/cgroup.subtree_control" "${_sw_add# }" || return 1; fi
  return 0
}
_sw_mkdirs() {
  if [ -n "$_sw_unified" ]; then
    _sw_cur=$_sw_unified; _sw_rest=$_sw_path/
    while [ -n "$_sw_rest" ]; do
      _sw_part=${_sw_rest%%/*}; _sw_rest=${_sw_rest#*/}
      _sw_cur=$_sw_cur/$_sw_part
      # Another slot's job may create the same parent at the same moment: losing that race
      # is fine, only a directory still missing is an error.
      if [ ! -d "$_sw_cur" ]; then
        mkdir "$_sw_cur" 2>/dev/null || [ -d "$_sw_cur" ] || { _sw_err "cannot create cgroup $_sw_cur"; return 1; }
      fi
    done
  fi
  for _sw_m in $_sw_mounts; do
    mkdir -p "$_sw_m/$_sw_path" || { _sw_err "cannot create cgroup $_sw_m/$_sw_path"; return 1; }
  done
  return 0
}
_sw_make() {
  _sw_new=()
  if [ -n "$_sw_unified" ]; then
    _sw_want=
    for _sw_c in cpu memory pids; do
      _sw_backend $_sw_c
      if [ "$_sw_kind" = v2 ]; then _sw_want="$_sw_want $_sw_c"; fi
    done
    _sw_cur=$_sw_unified; _sw_rest=$_sw_path/
    while [ -n "$_sw_rest" ]; do
      _sw_part=${_sw_rest%%/*}; _sw_rest=${_sw_rest#*/}
      if [ -n "$_sw_want" ]; then _sw_enable "$_sw_cur" || return 1; fi
      _sw_cur=$_sw_cur/$_sw_part
      if [ ! -d "$_sw_cur" ]; then
        # Nothing to enable below it: the rest of the path goes to the one `mkdir -p`.
        if [ -z "$_sw_rest" ] || [ -z "$_sw_want" ]; then
          _sw_new+=("$_sw_unified/$_sw_path"); break
        fi
        mkdir "$_sw_cur" 2>/dev/null || [ -d "$_sw_cur" ] || { _sw_err "cannot create cgroup $_sw_cur"; return 1; }
      fi
    done
  fi
  for _sw_m in $_sw_mounts; do
    if [ ! -d "$_sw_m/$_sw_path" ]; then _sw_new+=("$_sw_m/$_sw_path"); fi
  done
  if [ "${#_sw_new[@]}" -gt 0 ] && ! mkdir -p "${_sw_new[@]}" 2>/dev/null; then
    _sw_mkdirs || return 1
  fi
  return 0
}
"#;

/// Find stale slots: sets `_sw_found` to the slot numbers under `_sw_parent` matching
/// `_sw_pre<n>_sw_suf` and not in `_sw_keep`.
const SWEEP: &str = r#"
_sw_found=
for _sw_m in $_sw_unified $_sw_mounts; do
  _sw_base=$_sw_m${_sw_parent:+/$_sw_parent}
  for _sw_d in "$_sw_base/$_sw_pre"*"$_sw_suf"; do
    if [ ! -d "$_sw_d" ]; then continue; fi
    _sw_n=${_sw_d##*/}; _sw_n=${_sw_n#"$_sw_pre"}; _sw_n=${_sw_n%"$_sw_suf"}
    case "$_sw_n" in ''|*[!0-9]*|0?*) continue ;; esac
    case "$_sw_keep" in *" $_sw_n "*) continue ;; esac
    case " $_sw_found " in *" $_sw_n "*) ;; *) _sw_found="$_sw_found $_sw_n" ;; esac
  done
done
"#;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn root_validation() {
        assert_eq!(ScriptRoot::default().as_str(), "/sys/fs/cgroup");
        assert_eq!(
            ScriptRoot::new("/sys/fs/cgroup/").unwrap().as_str(),
            "/sys/fs/cgroup"
        );
        assert!(ScriptRoot::new("sys/fs").is_err());
        assert!(ScriptRoot::new("/tmp/a b").is_err());
        assert!(ScriptRoot::new("/tmp/$(x)").is_err());
    }

    #[test]
    fn quote_escapes_single_quotes() {
        assert_eq!(quote("a'b"), r"'a'\''b'");
    }

    #[test]
    fn parse_report_line() {
        let out = "noise\nslipway-cgroup: cleaned slipway/slot-0 oom_kills=2\n";
        assert_eq!(parse_oom_kills(out), Some(2));
        assert_eq!(parse_oom_kills("nothing"), None);
    }

    #[test]
    fn create_embeds_computed_values() {
        let path = SlotTemplate::default().expand(1);
        let limits = Limits {
            cpu: Some(0.5),
            memory_bytes: Some(64 << 20),
            pids: Some(50),
        };
        let s = create(&ScriptRoot::default(), &path, &limits).unwrap();
        assert!(s.contains("'50000 100000'"));
        assert!(s.contains("cpu.cfs_quota_us\" 50000"));
        assert!(s.contains("memory.max\" 67108864"));
        assert!(s.contains("pids.max\" 50"));
        assert!(s.contains("_sw_path='slipway/slot-1'"));
        let bad = Limits {
            cpu: Some(-1.0),
            ..Limits::NONE
        };
        assert!(create(&ScriptRoot::default(), &path, &bad).is_err());
    }

    #[test]
    fn rounds_cover_timeout() {
        assert_eq!(rounds(Duration::from_secs(10)), 200);
        assert_eq!(rounds(Duration::from_millis(1)), 1);
    }

    #[test]
    fn enter_spawns_nothing() {
        // Every step runs it: no command substitution, no external command.
        let s = enter(&ScriptRoot::default(), &SlotTemplate::default().expand(0));
        for spawn in ["$(", "`", "cat ", "pwd", "mkdir", "find ", "sort "] {
            assert!(!s.contains(spawn), "{spawn:?} in the enter prologue");
        }
    }

    fn run_bash(script: &str) -> std::process::Output {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }

    #[test]
    fn scripts_resolve_co_mounted_v1_controllers_once() {
        use std::fs;
        let tmp = tempfile::TempDir::new().unwrap();
        let dir = tmp.path();
        for c in ["cpu,cpuacct", "memory", "pids", "freezer"] {
            fs::create_dir_all(dir.join(c)).unwrap();
            fs::write(dir.join(c).join("cgroup.procs"), "").unwrap();
        }
        std::os::unix::fs::symlink("cpu,cpuacct", dir.join("cpu")).unwrap();
        std::os::unix::fs::symlink("cpu,cpuacct", dir.join("cpuacct")).unwrap();
        let root = ScriptRoot::new(dir.to_str().unwrap()).unwrap();
        let path = SlotTemplate::default().expand(2);
        let limits = Limits {
            cpu: Some(2.0),
            memory_bytes: Some(1 << 20),
            pids: Some(9),
        };
        let out = run_bash(&create(&root, &path, &limits).unwrap());
        assert!(out.status.success(), "{out:?}");
        let slot = |c: &str, f: &str| dir.join(c).join("slipway/slot-2").join(f);
        let read = |p: std::path::PathBuf| fs::read_to_string(p).unwrap();
        assert_eq!(read(slot("cpu,cpuacct", "cpu.cfs_quota_us")), "200000");
        assert_eq!(read(slot("memory", "memory.limit_in_bytes")), "1048576");
        assert_eq!(read(slot("pids", "pids.max")), "9");
        assert!(slot("freezer", "").is_dir());
        // The symlinks are not separate mounts: nothing was made through them.
        assert_eq!(fs::read_dir(dir).unwrap().count(), 6);

        // The prologue writes the shell's pid once per distinct mount.
        let out = run_bash(&format!("{}echo $$", enter(&root, &path)));
        assert!(out.status.success(), "{out:?}");
        let pid = String::from_utf8(out.stdout).unwrap();
        for c in ["cpu,cpuacct", "memory", "pids", "freezer"] {
            assert_eq!(read(slot(c, "cgroup.procs")), pid.trim(), "{c}");
        }
    }

    #[test]
    fn create_reports_the_directory_it_cannot_make() {
        use std::fs;
        let tmp = tempfile::TempDir::new().unwrap();
        let dir = tmp.path();
        for c in ["cpu", "memory"] {
            fs::create_dir_all(dir.join(c)).unwrap();
            fs::write(dir.join(c).join("cgroup.procs"), "").unwrap();
        }
        // A file where the slot's parent should be in one mount.
        fs::write(dir.join("memory/slipway"), "").unwrap();
        let root = ScriptRoot::new(dir.to_str().unwrap()).unwrap();
        let path = SlotTemplate::default().expand(0);
        let out = run_bash(&create(&root, &path, &Limits::NONE).unwrap());
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected = format!(
            "slipway-cgroup: cannot create cgroup {}/memory/slipway/slot-0",
            dir.canonicalize().unwrap().display()
        );
        assert!(stderr.contains(&expected), "{stderr}");
        // The slot made in the other mount is removed again.
        assert!(!dir.join("cpu/slipway/slot-0").exists());
    }
}
