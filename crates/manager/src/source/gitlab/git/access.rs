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
