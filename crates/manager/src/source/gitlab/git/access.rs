//! How git reaches the job's repository: the URL without credentials, and the settings that
//! carry the job token, TLS files and `GIT_SUBMODULE_FORCE_HTTPS` through git's environment
//! (`GIT_CONFIG_COUNT`), so they never reach argv (`ps`) or `.git/config` (the job's files).

use base64::Engine as _;
use slipway_gitlab::{TlsFiles, host_of};
use slipway_job::JobResponse;
use tokio::process::Command;

/// The repository to fetch and the git settings that reach it.
#[derive(Clone)]
pub(super) struct Remote {
    /// The URL, without `user:password@`.
    pub url: String,
    /// `(key, value)` settings given to every git command of the job.
    settings: Vec<(String, String)>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The settings hold the job token.
        f.debug_struct("Remote")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// The remote of `job`: its `repo_url` (or `clone_url` with the project's path), with the
    /// job token and the TLS files scoped to that server only, so a submodule or LFS store on
    /// another host never receives them.
    pub fn of(
        job: &JobResponse,
        clone_url: Option<&str>,
        tls: &TlsFiles,
        force_https: bool,
    ) -> Self {
        let (url, credentials) = split_credentials(job.git_info.repo_url.trim());
        let url = match clone_url {
            // GitLab Runner's rule: clone_url + project path (also right under a sub-path).
            Some(base) => match job.variable("CI_PROJECT_PATH").filter(|p| !p.is_empty()) {
                Some(project) => format!("{}/{project}.git", base.trim_end_matches('/')),
                None => with_base(&url, base),
            },
            None => url,
        };
        let mut settings = Vec::new();
        if let Some(server) = server_of(&url) {
            if let Some((user, pass)) = credentials {
                let basic =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
                settings.push((
                    format!("http.{server}.extraHeader"),
                    format!("Authorization: Basic {basic}"),
                ));
            }
            for (key, file) in [
                ("sslCAInfo", &tls.ca_file),
                ("sslCert", &tls.cert_file),
                ("sslKey", &tls.key_file),
            ] {
                if let Some(f) = file {
                    settings.push((format!("http.{server}.{key}"), f.display().to_string()));
                }
            }
            if force_https && let Some(host) = host_of(&server) {
                // git@host:group/p.git and ssh://git@host/group/p.git fetched over HTTPS,
                // where the job token applies.
                for from in [format!("git@{host}:"), format!("ssh://git@{host}/")] {
                    settings.push((format!("url.{server}.insteadOf"), from));
                }
            }
        }
        Self { url, settings }
    }

    /// Give `cmd` these settings through its environment (inherited by the git processes it
    /// starts: submodule clones, git-lfs).
    pub fn apply(&self, cmd: &mut Command) {
        if self.settings.is_empty() {
            return;
        }
        // git lets these variables override any setting, the server's own included: with
        // files of our own for the server, the manager's environment must not win.
        for (var, key) in [
            ("GIT_SSL_CAINFO", ".sslCAInfo"),
            ("GIT_SSL_CERT", ".sslCert"),
            ("GIT_SSL_KEY", ".sslKey"),
        ] {
            if self.settings.iter().any(|(k, _)| k.ends_with(key)) {
                cmd.env_remove(var);
            }
        }
        cmd.env("GIT_CONFIG_COUNT", self.settings.len().to_string());
        for (i, (k, v)) in self.settings.iter().enumerate() {
            cmd.env(format!("GIT_CONFIG_KEY_{i}"), k)
                .env(format!("GIT_CONFIG_VALUE_{i}"), v);
        }
    }

    /// The `(key, value)` settings; the values may be secret.
    pub fn settings(&self) -> &[(String, String)] {
        &self.settings
    }

    /// Whether git fetching `url` (after this remote's `insteadOf` rewrites) reaches the
    /// repository's own server: the same host and port, over a transport a submodule may use
    /// (never SSH: the manager's own identity). What a repository names for its submodules or
    /// LFS store is its author's choice; only this server is the runner's.
    pub fn serves(&self, url: &str) -> bool {
        let url = self.rewritten(url);
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        if !matches!(scheme.as_deref(), Some("http" | "https" | "git")) {
            return false;
        }
        matches!(
            (endpoint_of(&url), endpoint_of(&self.url)),
            (Some(a), Some(b)) if a == b
        )
    }

    /// The repository's server as `host:port`, for messages.
    pub fn server(&self) -> String {
        match endpoint_of(&self.url) {
            Some((host, port)) if host.contains(':') => format!("[{host}]:{port}"),
            Some((host, port)) => format!("{host}:{port}"),
            None => self.url.clone(),
        }
    }

    /// `url` as git rewrites it with this remote's `url.<base>.insteadOf` settings (the
    /// longest prefix wins, as in git).
    fn rewritten(&self, url: &str) -> String {
        let best = self
            .settings
            .iter()
            .filter_map(|(k, from)| {
                let base = k.strip_prefix("url.")?.strip_suffix(".insteadOf")?;
                url.starts_with(from.as_str()).then_some((base, from.len()))
            })
            .max_by_key(|(_, len)| *len);
        match best {
            Some((base, len)) => format!("{base}{}", &url[len..]),
            None => url.to_string(),
        }
    }

    /// The setting names given (their values may be secret), for tests.
    #[cfg(test)]
    fn keys(&self) -> Vec<&str> {
        self.settings.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// `scheme://host[:port]/` of an http(s) URL: what git's `http.<url>.*` settings match.
fn server_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !matches!(scheme, "http" | "https") {
        return None;
    }
    let authority = rest.split('/').next().filter(|a| !a.is_empty())?;
    Some(format!("{scheme}://{authority}/"))
}

/// Where `url` leads: its host (lowercase, without an IPv6 address's brackets) and port (the
/// scheme's default when none is written; `user@host:path` is SSH). `None` for what names no
/// host (a path, `file://`) or no port: such a URL is never the repository's server.
pub(super) fn endpoint_of(url: &str) -> Option<(String, u16)> {
    let url = url.trim();
    let (scheme, authority) = match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            (scheme.to_ascii_lowercase(), &rest[..end])
        }
        // scp-like syntax: `[user@]host:path`, no slash before the colon.
        None => {
            let (authority, _) = url.split_once(':')?;
            if authority.contains('/') || authority.starts_with('[') {
                return None;
            }
            ("ssh".to_string(), authority)
        }
    };
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match hostport.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']')?;
            (host, after.strip_prefix(':'))
        }
        None => match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        },
    };
    if host.is_empty() {
        return None;
    }
    let port = match port.filter(|p| !p.is_empty()) {
        Some(p) => p.parse().ok()?,
        None => match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            "git" => 9418,
            "ssh" | "git+ssh" | "ssh+git" => 22,
            _ => return None,
        },
    };
    Some((host.to_ascii_lowercase(), port))
}

/// A URL without its `user:password@` part, and that part.
pub(super) fn split_credentials(url: &str) -> (String, Option<(String, String)>) {
    let Some(scheme_end) = url.find("://") else {
        return (url.to_string(), None);
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_string(), None);
    };
    let userinfo = &rest[..at];
    let clean = format!("{}{}", &url[..scheme_end + 3], &rest[at + 1..]);
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    (clean, Some((user.to_string(), pass.to_string())))
}

/// `url` with its scheme and host (and any path prefix) taken from `base`, as GitLab Runner
/// applies `clone_url`: `https://gitlab.example.com/g/p.git` with `http://10.0.0.5:8080`
/// becomes `http://10.0.0.5:8080/g/p.git`.
fn with_base(url: &str, base: &str) -> String {
    let path = url
        .find("://")
        .and_then(|i| url[i + 3..].find('/').map(|j| &url[i + 3 + j..]))
        .unwrap_or("");
    format!("{}{path}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_leave_the_url() {
        let (url, creds) =
            split_credentials("https://gitlab-ci-token:glcbt-abc@gitlab.example.com/g/p.git");
        assert_eq!(url, "https://gitlab.example.com/g/p.git");
        assert_eq!(
            creds,
            Some(("gitlab-ci-token".to_string(), "glcbt-abc".to_string()))
        );
        let (url, creds) = split_credentials("file:///srv/repo.git");
        assert_eq!(url, "file:///srv/repo.git");
        assert_eq!(creds, None);
        // An @ in the path is not a user.
        let (url, creds) = split_credentials("https://host/a@b.git");
        assert_eq!(url, "https://host/a@b.git");
        assert_eq!(creds, None);
    }

    #[test]
    fn a_url_s_endpoint_is_its_host_and_port() {
        let e = |u: &str| endpoint_of(u);
        let at = |h: &str, p: u16| Some((h.to_string(), p));
        assert_eq!(
            e("https://GitLab.example.com/g/p.git"),
            at("gitlab.example.com", 443)
        );
        assert_eq!(
            e("http://u:p@127.0.0.1:8080/g/p.git"),
            at("127.0.0.1", 8080)
        );
        assert_eq!(e("http://[::1]:9/x"), at("::1", 9));
        assert_eq!(e("https://[::1]/x"), at("::1", 443));
        assert_eq!(e("git://host/x"), at("host", 9418));
        assert_eq!(e("git@host:g/p.git"), at("host", 22));
        assert_eq!(e("ssh://git@host:2222/g/p.git"), at("host", 2222));
        assert_eq!(e("http://host?x"), at("host", 80));
        for none in [
            "file:///srv/p.git",
            "/srv/p.git",
            "../lib.git",
            "http://host:port/x",
            "weird://host/x",
        ] {
            assert_eq!(e(none), None, "{none}");
        }
    }

    #[test]
    fn only_the_repository_s_host_and_port_are_its_server() {
        let mut job = JobResponse::default();
        job.git_info.repo_url = "http://gitlab-ci-token:t@127.0.0.1:8080/g/p.git".into();
        let r = Remote::of(&job, None, &TlsFiles::default(), true);
        assert_eq!(r.server(), "127.0.0.1:8080");
        for ok in [
            "http://127.0.0.1:8080/g/lib.git",
            "http://someone@127.0.0.1:8080/other/lib.git",
            "HTTP://127.0.0.1:8080/x",
            // GIT_SUBMODULE_FORCE_HTTPS sends these to the server.
            "git@127.0.0.1:g/lib.git",
            "ssh://git@127.0.0.1/g/lib.git",
        ] {
            assert!(r.serves(ok), "{ok}");
        }
        for foreign in [
            "http://127.0.0.1:8081/g/lib.git",
            "http://localhost:8080/g/lib.git",
            "http://169.254.169.254/latest/meta-data",
            "https://127.0.0.1/g/lib.git",
            "http://127.0.0.1:8080@169.254.169.254/x",
            "ssh://git@127.0.0.1:8080/g/lib.git",
            "file:///etc",
            "/srv/lib.git",
        ] {
            assert!(!r.serves(foreign), "{foreign}");
        }
        // Without GIT_SUBMODULE_FORCE_HTTPS an SSH URL is SSH (port 22).
        let r = Remote::of(&job, None, &TlsFiles::default(), false);
        assert!(!r.serves("git@127.0.0.1:g/lib.git"));
        // clone_url moves the server.
        let r = Remote::of(
            &job,
            Some("http://10.0.0.5:9000"),
            &TlsFiles::default(),
            false,
        );
        assert!(r.serves("http://10.0.0.5:9000/g/lib.git"));
        assert!(!r.serves("http://127.0.0.1:8080/g/lib.git"));
    }

    #[test]
    fn clone_url_replaces_scheme_and_host() {
        assert_eq!(
            with_base(
                "https://gitlab.example.com/g/p.git",
                "http://10.0.0.5:8080/"
            ),
            "http://10.0.0.5:8080/g/p.git"
        );
    }

    #[test]
    fn token_and_tls_are_scoped_to_the_server() {
        let mut job = JobResponse::default();
        job.git_info.repo_url =
            "https://gitlab-ci-token:glcbt-abc@gitlab.example.com:8443/g/p.git".into();
        let tls = TlsFiles {
            ca_file: Some("/etc/ca.pem".into()),
            ..TlsFiles::default()
        };
        let r = Remote::of(&job, None, &tls, true);
        assert_eq!(r.url, "https://gitlab.example.com:8443/g/p.git");
        assert_eq!(
            r.keys(),
            vec![
                "http.https://gitlab.example.com:8443/.extraHeader",
                "http.https://gitlab.example.com:8443/.sslCAInfo",
                "url.https://gitlab.example.com:8443/.insteadOf",
                "url.https://gitlab.example.com:8443/.insteadOf",
            ]
        );
        assert_eq!(r.settings[2].1, "git@gitlab.example.com:");
        assert!(!format!("{r:?}").contains("glcbt"));
        // A local repository gets no http settings.
        job.git_info.repo_url = "file:///srv/p.git".into();
        assert!(Remote::of(&job, None, &tls, true).keys().is_empty());
    }
}
