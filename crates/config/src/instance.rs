//! `[runners.instance]`: the instance executor's own keys.

use serde::Deserialize;

use crate::autoscaler::AutoscalerConfig;
use crate::executor::Executor;
use crate::problem::Report;

/// `[runners.instance]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct InstanceConfig {
    /// VM images jobs may name with VM isolation (`["*"]`: all).
    pub allowed_images: Vec<String>,
    /// One build directory for all jobs (honoured with VM isolation or `max_use_count = 1`).
    pub use_common_build_dir: bool,
}

impl InstanceConfig {
    /// Warnings: the section under another executor, a common build directory jobs would share.
    pub(crate) fn validate(
        &self,
        executor: &Executor,
        auto: Option<&AutoscalerConfig>,
        report: &mut Report<'_>,
    ) {
        if executor.is_known() && *executor != Executor::Instance {
            report.warning(
                &[],
                format!(
                    "only the instance executor reads [runners.instance]; ignored for the {executor} executor"
                ),
            );
        }
        let isolated = auto
            .and_then(|a| a.vm_isolation.as_ref())
            .is_some_and(|v| v.enabled);
        let single_use = auto.is_some_and(|a| a.max_use_count == 1);
        if self.use_common_build_dir && !isolated && !single_use {
            report.warning(
                &["use_common_build_dir"],
                "honoured only with VM isolation or max_use_count = 1 (jobs sharing an instance would share a build directory)",
            );
        }
    }
}
