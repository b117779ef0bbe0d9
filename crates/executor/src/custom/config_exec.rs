//! What `config_exec` prints: the job's dynamic configuration as JSON.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::CustomError;

/// `driver` in `config_exec`'s output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct DriverInfo {
    /// The driver's name, shown in the trace.
    pub name: Option<String>,
    /// The driver's version, shown after the name.
    pub version: Option<String>,
}

/// What `config_exec` prints; unknown keys are ignored.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ConfigExecOutput {
    /// Builds root replacing `[[runners]] builds_dir`.
    pub builds_dir: Option<String>,
    /// Cache root replacing `[[runners]] cache_dir` (Slipway keeps no local cache yet).
    pub cache_dir: Option<String>,
    /// Whether concurrent jobs share the builds directory.
    pub builds_dir_is_shared: Option<bool>,
    /// Hostname of the job's environment.
    pub hostname: Option<String>,
    /// The driver's name and version.
    pub driver: Option<DriverInfo>,
    /// Variables for the later driver calls (not for the job); may hold credentials.
    pub job_env: Option<BTreeMap<String, String>>,
}

impl fmt::Debug for ConfigExecOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // job_env often carries credentials: keys only.
        let keys: Vec<&String> = self.job_env.iter().flat_map(|m| m.keys()).collect();
        f.debug_struct("ConfigExecOutput")
            .field("builds_dir", &self.builds_dir)
            .field("cache_dir", &self.cache_dir)
            .field("builds_dir_is_shared", &self.builds_dir_is_shared)
            .field("hostname", &self.hostname)
            .field("driver", &self.driver)
            .field("job_env_keys", &keys)
            .finish()
    }
}

impl ConfigExecOutput {
    /// Parse `config_exec`'s stdout; empty output means no settings.
    pub fn parse(stdout: &[u8]) -> Result<Self, CustomError> {
        if stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(ConfigExecOutput::default());
        }
        Ok(serde_json::from_slice(stdout)?)
    }

    /// GitLab's startup line: `Using Custom executor with driver NAME VERSION...`.
    pub fn banner(&self) -> String {
        const USAGE: &str = "Using Custom executor";
        match self.driver.as_ref().map(|d| (&d.name, &d.version)) {
            Some((Some(name), Some(version))) => format!("{USAGE} with driver {name} {version}..."),
            Some((Some(name), None)) => format!("{USAGE} with driver {name}..."),
            _ => format!("{USAGE}..."),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_exec_output_parses_and_ignores_unknown_keys() {
        let out = ConfigExecOutput::parse(
            br#"{"builds_dir": "/b", "cache_dir": "/c", "builds_dir_is_shared": true,
                "hostname": "h", "driver": {"name": "test driver", "version": "v0.0.1"},
                "job_env": {"CUSTOM_ENVIRONMENT": "example"}, "extra": 1}"#,
        )
        .unwrap();
        assert_eq!(out.builds_dir.as_deref(), Some("/b"));
        assert_eq!(out.builds_dir_is_shared, Some(true));
        assert_eq!(
            out.banner(),
            "Using Custom executor with driver test driver v0.0.1..."
        );
        assert_eq!(
            out.job_env
                .as_ref()
                .and_then(|m| m.get("CUSTOM_ENVIRONMENT")),
            Some(&"example".to_string())
        );
        // Debug shows job_env's keys, never its values.
        assert!(!format!("{out:?}").contains("example"));

        let empty = ConfigExecOutput::parse(b"  \n").unwrap();
        assert_eq!(empty.banner(), "Using Custom executor...");
        let name_only = ConfigExecOutput::parse(br#"{"driver": {"name": "d"}}"#).unwrap();
        assert_eq!(name_only.banner(), "Using Custom executor with driver d...");
        assert!(ConfigExecOutput::parse(b"not json").is_err());
    }
}
