//! The real plugin binary driven through `slipway_fleeting::PluginHost`, configured the standard
//! AWS way: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, SystemTime};

use common::{ACCESS_KEY, Moto, REGION, SECRET_KEY};
use slipway_fleeting::host::PluginOptions;
use slipway_fleeting::{ConnectorConfig, GroupError, InstanceGroup, PluginHost, State};

/// Plugin options with an environment that cannot reach past moto: no shared files, no IMDS.
fn options(moto: &Moto, dir: &std::path::Path, name: &str) -> PluginOptions {
    PluginOptions::new("aws", env!("CARGO_BIN_EXE_fleeting-plugin-aws"))
        .handshake_timeout(Duration::from_secs(30))
        .plugin_config(serde_json::json!({ "name": name }).to_string())
        .connector(ConnectorConfig::default())
        .env("AWS_ENDPOINT_URL", &moto.url)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", dir.join("config").to_string_lossy())
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("credentials").to_string_lossy(),
        )
}

#[tokio::test]
async fn binary_lifecycle_over_the_plugin_protocol() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    let asg = moto.create_group("ci", 3).await?;
    let dir = tempfile::tempdir()?;
    let host =
        PluginHost::start(options(&moto, dir.path(), "ci").env("AWS_REGION", REGION)).await?;

    let info = host.init_from_options().await?;
    assert_eq!(info.id, "aws/eu-west-1/ci");
    assert_eq!(info.max_size, 3);
    assert_eq!(host.increase(5).await?, 3, "capped at MaxSize");
    let list = host.update().await?;
    assert_eq!(list.len(), 3);
    assert!(list.iter().all(|(_, s)| *s == State::Running), "{list:?}");

    let id = list[0].0.clone();
    let ci = host.connect_info(&id).await?;
    assert_eq!(ci.connector.username, "ec2-user");
    assert!(!ci.connector.key.is_empty());
    let expires = ci.expires.expect("expires");
    assert!(expires > SystemTime::now() && expires <= SystemTime::now() + Duration::from_secs(60));

    assert_eq!(
        host.decrease(std::slice::from_ref(&id)).await?,
        vec![id.clone()]
    );
    assert_eq!(asg.describe().await?.0, 2);
    let list = host.update().await?;
    assert!(list.contains(&(id.clone(), State::Deleted)), "{list:?}");
    host.heartbeat(&list.iter().find(|(_, s)| *s == State::Running).unwrap().0)
        .await?;
    assert!(host.heartbeat(&id).await.is_err());
    host.stop().await;
    Ok(())
}

#[tokio::test]
async fn binary_without_region_names_every_source() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    let dir = tempfile::tempdir()?;
    let host = PluginHost::start(options(&moto, dir.path(), "ci")).await?;
    let err = host.init_from_options().await.unwrap_err();
    assert!(matches!(err, GroupError::InvalidArgument(_)), "{err:?}");
    let text = err.to_string();
    for source in [
        "`region`",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "config_file",
    ] {
        assert!(text.contains(source), "{source} missing in: {text}");
    }
    host.stop().await;
    Ok(())
}
