//! `slipway plugin check` passes on the AWS plugin against moto in server mode, configured the
//! standard AWS way (environment); moto's instances run nothing, so there is no `--connect`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{ACCESS_KEY, Moto, REGION, SECRET_KEY};

#[tokio::test]
async fn plugin_check_passes_against_moto() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    let asg = moto.create_group("check", 2).await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("plugin_config.json");
    std::fs::write(&config, serde_json::json!({ "name": "check" }).to_string())?;
    let s = |p: &str| dir.path().join(p).to_string_lossy().into_owned();
    let env: Vec<(String, String)> = [
        ("AWS_ENDPOINT_URL", moto.url.clone()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
        ("AWS_REGION", REGION.into()),
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ("AWS_CONFIG_FILE", s("config")),
        ("AWS_SHARED_CREDENTIALS_FILE", s("credentials")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let plugin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_fleeting-plugin-aws"));
    let run = tokio::task::spawn_blocking(move || {
        slipway_testkit::plugin_check::plugin_check(&plugin, &config, &[], &env)
    })
    .await??;
    assert_eq!(run.code, Some(0), "{:?}\n{}", run.failures(), run.explain());
    assert_eq!(run.report["passed"], true, "{}", run.explain());
    for check in [
        "init-bad-config",
        "init",
        "increase",
        "connect-info",
        "restart",
        "unknown-ids",
        "decrease",
    ] {
        assert_eq!(run.result(check), "pass", "{check}: {}", run.explain());
    }
    assert_eq!(run.result("ssh"), "skip", "{}", run.explain());
    // What the checker made, it removed: the group is back to nothing in service.
    let (desired, instances) = asg.describe().await?;
    assert_eq!(desired, 0, "{instances:?}");
    // The secret never reaches the output.
    assert!(!run.stderr.contains(SECRET_KEY) && !run.report.to_string().contains(SECRET_KEY));
    Ok(())
}
