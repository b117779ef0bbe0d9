//! Secrets in config.toml (`token`, `password`, `[runners.cache.s3]` and the like): which keys
//! hold them, and masking them out of every message.

use crate::problem::Seg;

/// Whether a key of this name holds a secret.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    // token_obtained_at / token_expires_at are dates, not secrets.
    !k.ends_with("_at")
        && [
            "token",
            "password",
            "secret",
            "sentry_dsn",
            "accesskey",
            "accountkey",
        ]
        .iter()
        .any(|s| k.contains(s))
}

/// Whether the value at `path` may be a secret: a secret-named key, anything in a distributed
/// cache's provider table or a plugin's config, an `environment` entry.
pub(crate) fn is_secret_path(path: &[Seg]) -> bool {
    let keys: Vec<&str> = path
        .iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
        .collect();
    keys.iter().any(|k| is_secret_key(k))
        || keys
            .iter()
            .any(|k| matches!(*k, "environment" | "plugin_config" | "nesting_config"))
        || keys
            .windows(2)
            .any(|w| w[0] == "cache" && matches!(w[1], "s3" | "gcs" | "azure"))
}

/// Prefixes of GitLab's tokens (runner, registration, job, personal access).
const GITLAB_TOKEN_PREFIXES: &[&str] = &["glrt-", "glrtr-", "GR1348941", "glcbt-", "glpat-"];

/// Every secret value in the file, to be masked wherever a message might quote it.
pub(crate) fn secrets_of(table: &toml::Table) -> Vec<String> {
    fn walk(v: &toml::Value, parent: &str, secret: bool, out: &mut Vec<String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let s = secret
                        || is_secret_key(k)
                        || (parent == "cache" && matches!(k.as_str(), "s3" | "gcs" | "azure"));
                    walk(v, k, s, out);
                }
            }
            toml::Value::Array(a) => {
                for v in a {
                    if parent == "environment"
                        && let toml::Value::String(e) = v
                        && let Some((_, value)) = e.split_once('=')
                    {
                        // Short values ("1", "true") are rarely secrets and would garble text.
                        if value.len() >= 8 {
                            out.push(value.to_string());
                        }
                    }
                    walk(v, parent, secret, out);
                }
            }
            toml::Value::String(s) if secret && s.len() >= 4 => out.push(s.clone()),
            // A GitLab token pasted under the wrong key is still a token.
            toml::Value::String(s) if GITLAB_TOKEN_PREFIXES.iter().any(|p| s.starts_with(p)) => {
                out.push(s.clone())
            }
            toml::Value::Integer(_) | toml::Value::Float(_) if secret => {
                let s = v.to_string();
                if s.len() >= 4 {
                    out.push(s);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&toml::Value::Table(table.clone()), "", false, &mut out);
    // Longest first, so a secret containing another is masked whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// `message` with every one of `secrets` replaced by `[MASKED]`.
pub(crate) fn mask(message: &str, secrets: &[String]) -> String {
    slipway_job::mask_text(message, secrets)
}

/// A type error's message without the value it quotes.
pub(crate) fn without_value(message: &str) -> String {
    match message.find(", expected ") {
        Some(i) => format!("invalid type (value not shown){}", &message[i..]),
        None => "invalid value (not shown: this key may hold a secret)".into(),
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{GITLAB_WRITTEN, errors};

    #[test]
    fn secrets_are_never_quoted() {
        let text = GITLAB_WRITTEN
            .replace(
                "token = \"glrt-t1_secret-token-value\"",
                "token = 918273645\n  limit = \"glrt-t1_secret-token-value\"",
            )
            .replace(
                "[runners.cache.s3]",
                "[runners.cache.s3]\n      SecretKey = \"s3-secret-key-value\"\n      AccessKey = [\"s3-access\"]",
            )
            .replace("shell = \"sh\"", "shell = \"s3-secret-key-value\"");
        let e = errors(&text).join("\n");
        for secret in [
            "918273645",
            "glrt-t1_secret",
            "s3-secret-key-value",
            "s3-access",
        ] {
            assert!(!e.contains(secret), "{secret} in {e}");
        }
        assert!(
            e.contains("runners[0].token: invalid type (value not shown)"),
            "{e}"
        );
        assert!(e.contains("runners[0].shell: shell \"[MASKED]\""), "{e}");
    }
}
