//! The configuration Slipway uses when none is given (`slipway exec` without `-c`).

/// The embedded default config.toml: one `instance` runner over fleeting-plugin-local.
pub const EMBEDDED: &str = include_str!("embedded.toml");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::parse;

    #[test]
    fn embedded_config_is_valid() {
        let loaded = parse(EMBEDDED, "embedded").expect("embedded config");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        // Locally built images run without a registry.
        let docker = loaded.config.runners[0].docker.as_ref().expect("docker");
        assert_eq!(
            docker.pull_policy,
            [slipway_executor::docker::PullPolicy::IfNotPresent]
        );
    }
}
