//! Integration tests against the real Docker Engine on the local socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use common::{Cleanup, docker, run, sh, unique};
use futures::StreamExt;
use slipway_docker::{
    ContainerSpec, Error, ExecSpec, ImportOptions, LogOutput, LogsOptions, MAX_API_VERSION,
    NetworkSpec, VolumeSpec, WaitCondition,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_version_negotiation() {
    let docker = docker().await;
    docker.ping().await.unwrap();
    let v = docker.version().await.unwrap();
    assert_eq!(v.os, "linux");
    let server: slipway_docker::ApiVersion = v.api_version.parse().unwrap();
    assert_eq!(docker.api_version(), server.min(MAX_API_VERSION));
    // Many requests in a row reuse pooled connections and keep working.
    for _ in 0..20 {
        docker.ping().await.unwrap();
        docker
            .list_containers(Some("com.slipway.none=1"))
            .await
            .unwrap();
    }
}

/// Makes a tar holding a static busybox and an `sh` link, like the test script's rootfs.
async fn busybox_tar(dir: &std::path::Path) -> Vec<u8> {
    let root = dir.join("rootfs");
    tokio::fs::create_dir_all(root.join("bin")).await.unwrap();
    tokio::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .await
        .unwrap();
    for applet in ["sh", "cat", "echo"] {
        tokio::fs::symlink("busybox", root.join("bin").join(applet))
            .await
            .unwrap();
    }
    tokio::fs::write(root.join("marker"), "imported-ok\n")
        .await
        .unwrap();
    let out = tokio::process::Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["-c", "."])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_image_from_tar_and_run_it() {
    let docker = docker().await;
    let cleanup = Cleanup::new("import");
    let dir = tempfile::tempdir().unwrap();
    let tar = busybox_tar(dir.path()).await;
    let repo = unique("import");
    let opts = ImportOptions {
        repo: repo.clone(),
        tag: "v1".into(),
        changes: vec![r#"CMD ["/bin/cat", "/marker"]"#.into()],
        message: None,
    };
    let image = format!("{repo}:v1");
    let result = async {
        let id = docker.import_image(Bytes::from(tar.clone()), &opts).await?;
        assert!(id.starts_with("sha256:"), "{id}");
        let inspect = docker.inspect_image(&image).await?;
        assert_eq!(inspect.id, id);
        assert_eq!(
            inspect.config.unwrap().cmd.unwrap(),
            vec!["/bin/cat", "/marker"]
        );
        assert!(docker.list_images(None).await?.iter().any(|i| i.id == id));

        // The image's own CMD runs.
        let mut spec = ContainerSpec::new(image.clone());
        spec.labels = cleanup.labels();
        let (code, out, _) = run(&docker, &spec).await;
        assert_eq!(code, 0);
        assert_eq!(out.stdout_str(), "imported-ok\n");

        // The same tar streamed from a file under another tag.
        let path = dir.path().join("image.tar");
        tokio::fs::write(&path, &tar).await.unwrap();
        let file = tokio::fs::File::open(&path).await.unwrap();
        let opts2 = ImportOptions {
            tag: "v2".into(),
            ..opts.clone()
        };
        let id2 = docker.import_image_from_reader(file, &opts2).await?;
        assert!(docker.image_exists(&format!("{repo}:v2")).await?);
        assert!(id2.starts_with("sha256:"));
        Ok::<_, Error>(())
    }
    .await;
    drop(cleanup);
    for tag in ["v1", "v2"] {
        let _ = docker.remove_image(&format!("{repo}:{tag}"), true).await;
    }
    result.unwrap();
    assert!(!docker.image_exists(&image).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_output_is_demuxed_and_exit_code_returned() {
    let docker = docker().await;
    let cleanup = Cleanup::new("run");
    let mut spec = sh(
        &cleanup,
        "echo out1; echo err1 >&2; echo \"$GREETING from $(pwd) on $(hostname)\"; \
         echo err2 >&2; grep -q /slipway-docker-test/ /proc/self/cgroup || echo no-cgroup-parent; \
         exit 3",
    );
    spec.env = vec!["GREETING=hello".into()];
    spec.working_dir = Some("/tmp".into());
    spec.memory = Some(64 * 1024 * 1024);
    spec.nano_cpus = Some(500_000_000);
    spec.hostname = Some("job-host".into());
    // A fixed parent, so that repeated runs do not leave a trail of empty cgroup directories.
    spec.cgroup_parent = Some("/slipway-docker-test".into());
    let (code, out, id) = run(&docker, &spec).await;
    assert_eq!(code, 3);
    assert_eq!(out.stdout_str(), "out1\nhello from /tmp on job-host\n");
    assert_eq!(out.stderr_str(), "err1\nerr2\n");

    let info = docker.inspect_container(&id).await.unwrap();
    assert_eq!(info.state.status, "exited");
    assert_eq!(info.state.exit_code, 3);
    let config = info.config.unwrap();
    assert_eq!(
        config.labels.unwrap().get(common::LABEL_KEY),
        Some(&cleanup.value)
    );
    let host = info.host_config.unwrap();
    assert_eq!(host.memory, 64 * 1024 * 1024);
    assert_eq!(host.nano_cpus, 500_000_000);
    assert_eq!(host.cgroup_parent, "/slipway-docker-test");

    // Logs after the fact: same split, frame by frame.
    let mut logs = docker
        .logs(
            &id,
            &LogsOptions {
                stdout: true,
                stderr: true,
                ..LogsOptions::default()
            },
        )
        .await
        .unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = logs.next().await {
        chunks.push(c.unwrap());
    }
    assert!(chunks.contains(&LogOutput::StdErr(Bytes::from_static(b"err1\n"))));
    assert!(chunks.contains(&LogOutput::StdOut(Bytes::from_static(b"out1\n"))));

    // A following log stream of a running container ends when it exits.
    let spec = sh(&cleanup, "for i in 1 2 3; do echo tick$i; sleep 0.1; done");
    let id = docker.create_container(&spec).await.unwrap().id;
    docker.start_container(&id).await.unwrap();
    let out = docker
        .logs(&id, &LogsOptions::follow())
        .await
        .unwrap()
        .collect_output()
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "tick1\ntick2\ntick3\n");
    assert_eq!(
        docker
            .wait_container(&id, WaitCondition::NotRunning)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_remove_a_running_container() {
    let docker = docker().await;
    let cleanup = Cleanup::new("kill");
    let spec = sh(&cleanup, "sleep 300");
    let id = docker.create_container(&spec).await.unwrap().id;
    docker.start_container(&id).await.unwrap();
    assert!(docker.inspect_container(&id).await.unwrap().state.running);
    // Removing a running container without force is a conflict.
    let err = docker.remove_container(&id, false, true).await.unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    docker.kill_container(&id, "SIGKILL").await.unwrap();
    let code = docker
        .wait_container(&id, WaitCondition::NotRunning)
        .await
        .unwrap();
    assert_eq!(code, 137);
    docker.remove_container(&id, true, true).await.unwrap();
    let err = docker.inspect_container(&id).await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_a_script_with_stdin_in_a_running_container() {
    let docker = docker().await;
    let cleanup = Cleanup::new("exec");
    let spec = sh(&cleanup, "sleep 300");
    let id = docker.create_container(&spec).await.unwrap().id;
    docker.start_container(&id).await.unwrap();

    let script = "echo \"step one $JOB_VAR\"\necho warning >&2\ncd /tmp\npwd\nexit 5\necho never\n";
    let mut exec = ExecSpec::new(["sh", "-s"]);
    exec.env = vec!["JOB_VAR=42".into()];
    exec.working_dir = Some("/".into());
    let out = docker
        .exec_run(&id, &exec, Some(Bytes::from_static(script.as_bytes())))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 5, "{out:?}");
    assert_eq!(out.output.stderr_str(), "warning\n");
    assert!(out.output.stdout_str() == "step one 42\n/tmp\n", "{out:?}");

    // Without stdin, exit code 0, and output collected.
    let out = docker
        .exec_run(&id, &ExecSpec::new(["sh", "-c", "echo plain"]), None)
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.output.stdout_str(), "plain\n");

    // Stdin streamed piecewise through the low-level API; cat echoes it back.
    let mut spec = ExecSpec::new(["cat"]);
    spec.stdin = true;
    let exec_id = docker.create_exec(&id, &spec).await.unwrap();
    let mut attached = docker.start_exec(&exec_id, false).await.unwrap();
    use tokio::io::AsyncWriteExt;
    attached.input.write_all(b"line 1\n").await.unwrap();
    attached.input.write_all(b"line 2\n").await.unwrap();
    attached.input.shutdown().await.unwrap();
    let out = attached.output.collect_output().await.unwrap();
    assert_eq!(out.stdout_str(), "line 1\nline 2\n");
    assert_eq!(docker.exec_exit_code(&exec_id).await.unwrap(), 0);
    let info = docker.inspect_exec(&exec_id).await.unwrap();
    assert!(!info.running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_job_network_reaches_services_by_alias() {
    let docker = docker().await;
    let cleanup = Cleanup::new("net");
    let mut net = NetworkSpec::new(unique("net"));
    net.labels = cleanup.labels();
    let created = docker.create_network(&net).await.unwrap();
    let info = docker.inspect_network(&created.id).await.unwrap();
    assert_eq!(info.name, net.name);
    assert_eq!(info.driver, "bridge");

    // Service 1: aliases given at create time.
    let mut svc = sh(
        &cleanup,
        "mkdir -p /www && echo hello-from-svc > /www/index.html && exec httpd -f -p 8080 -h /www",
    );
    svc.network = Some(net.name.clone());
    svc.network_aliases = vec!["svc".into()];
    let svc_id = docker.create_container(&svc).await.unwrap().id;
    docker.start_container(&svc_id).await.unwrap();

    // Service 2: joined afterwards with connect + alias.
    let svc2 = sh(
        &cleanup,
        "mkdir -p /www && echo hello-from-db > /www/index.html && exec httpd -f -p 8080 -h /www",
    );
    let svc2_id = docker.create_container(&svc2).await.unwrap().id;
    docker
        .connect_network(&net.name, &svc2_id, &["db".to_string()])
        .await
        .unwrap();
    docker.start_container(&svc2_id).await.unwrap();

    let mut client = sh(
        &cleanup,
        "for i in $(seq 1 100); do \
           if wget -q -O - http://svc:8080/ && wget -q -O - http://db:8080/; then exit 0; fi; \
           sleep 0.1; \
         done; exit 1",
    );
    client.network = Some(net.name.clone());
    let (code, out, _) = run(&docker, &client).await;
    assert_eq!(code, 0, "{out:?}");
    assert!(
        out.stdout_str()
            .ends_with("hello-from-svc\nhello-from-db\n"),
        "{out:?}"
    );

    let svc_info = docker.inspect_container(&svc_id).await.unwrap();
    let endpoints = svc_info.network_settings.unwrap().networks.unwrap();
    let ep = endpoints.get(&net.name).unwrap();
    assert!(ep.aliases.as_ref().unwrap().contains(&"svc".to_string()));
    assert!(!ep.ip_address.is_empty());

    assert!(
        docker
            .list_networks(Some(&cleanup.label()))
            .await
            .unwrap()
            .iter()
            .any(|n| n.id == created.id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_volume_is_shared_between_containers() {
    let docker = docker().await;
    let cleanup = Cleanup::new("vol");
    let mut vol = VolumeSpec::new(unique("vol"));
    vol.labels = cleanup.labels();
    let created = docker.create_volume(&vol).await.unwrap();
    assert_eq!(created.name, vol.name);
    assert_eq!(
        docker.inspect_volume(&vol.name).await.unwrap().driver,
        "local"
    );

    let mut writer = sh(&cleanup, "echo kept > /data/file");
    writer.binds = vec![format!("{}:/data", vol.name)];
    assert_eq!(run(&docker, &writer).await.0, 0);
    let mut reader = sh(&cleanup, "cat /data/file");
    reader.binds = vec![format!("{}:/data", vol.name)];
    let (code, out, _) = run(&docker, &reader).await;
    assert_eq!((code, out.stdout_str().as_str()), (0, "kept\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_by_label_removes_only_that_label() {
    let docker = docker().await;
    let mine = Cleanup::new("cleanup-mine");
    let other = Cleanup::new("cleanup-other");

    for c in [&mine, &other] {
        let mut net = NetworkSpec::new(unique("cnet"));
        net.labels = c.labels();
        docker.create_network(&net).await.unwrap();
        let mut vol = VolumeSpec::new(unique("cvol"));
        vol.labels = c.labels();
        docker.create_volume(&vol).await.unwrap();
        // One running container on the network using the volume, one merely created.
        let mut running = sh(c, "sleep 300");
        running.network = Some(net.name.clone());
        running.binds = vec![format!("{}:/data", vol.name)];
        running.volumes = vec!["/anon".into()];
        let id = docker.create_container(&running).await.unwrap().id;
        docker.start_container(&id).await.unwrap();
        docker.create_container(&sh(c, "true")).await.unwrap();
    }

    let report = docker.cleanup_by_label(&mine.label()).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.containers.len(), 2, "{report:?}");
    assert_eq!(report.networks.len(), 1, "{report:?}");
    assert_eq!(report.volumes.len(), 1, "{report:?}");
    assert!(
        docker
            .list_containers(Some(&mine.label()))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        docker
            .list_networks(Some(&mine.label()))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        docker
            .list_volumes(Some(&mine.label()))
            .await
            .unwrap()
            .is_empty()
    );

    // The other label's objects are untouched.
    assert_eq!(
        docker
            .list_containers(Some(&other.label()))
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        docker
            .list_networks(Some(&other.label()))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        docker
            .list_volumes(Some(&other.label()))
            .await
            .unwrap()
            .len(),
        1
    );

    let report = docker.cleanup_by_label(&other.label()).await.unwrap();
    assert_eq!(
        (
            report.containers.len(),
            report.networks.len(),
            report.volumes.len()
        ),
        (2, 1, 1)
    );
    // Again: nothing left.
    assert!(
        docker
            .cleanup_by_label(&other.label())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulling_a_missing_image_fails_clearly() {
    let docker = docker().await;
    let image = format!("{}:latest", unique("no-such-image"));
    let err = docker.inspect_image(&image).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert!(
        err.to_string().to_lowercase().contains("no such image"),
        "{err}"
    );

    let err = docker.pull_image(&image).await.unwrap_err();
    match &err {
        Error::Pull {
            image: i, message, ..
        } => {
            assert_eq!(i, &image);
            assert!(!message.is_empty());
        }
        other => panic!("expected a pull error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("pulling image {image}: ")),
        "{text}"
    );
    eprintln!("pull error as reported: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_conflict_is_a_conflict_error() {
    let docker = docker().await;
    let cleanup = Cleanup::new("conflict");
    let mut spec = sh(&cleanup, "true");
    spec.name = Some(unique("named"));
    docker.create_container(&spec).await.unwrap();
    let err = docker.create_container(&spec).await.unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    assert!(err.to_string().contains("already in use"), "{err}");
    // Unknown image on create is not-found.
    let mut spec = ContainerSpec::new(format!("{}:latest", unique("missing")));
    spec.labels = cleanup.labels();
    let err = docker.create_container(&spec).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
}
