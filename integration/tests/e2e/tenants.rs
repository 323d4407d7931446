//! End-to-end tests: a tenant's job on a node, kept from the agent.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use fmsched_integration::*;

use crate::{JOIN, all_completed, fmctl, jobs, submit};

/// A job as a tenant would write it, running `command`.
fn probe_job(name: &str, command: &str, env: &str) -> String {
    format!(
        "name: {name}\nmodel: roberta-base\ndataset: {{ uri: file:///data/rte, task: rte, num_samples: 3200 }}\n\
         hyperparameters: {{ global_batch_size: 32, learning_rate: 2.0e-5, amp: true }}\n\
         target: {{ max_iterations: 300 }}\n\
         resources: {{ min_gpus: 1, max_gpus: 1 }}\n\
         launch:\n  command: {command}\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"100\"{env} }}\n"
    )
}

/// A tenant's job runs as the agent's unprivileged `processes.run_as`
/// user, in a task folder of its own (mode 0700), with an environment
/// built from an allow-list: it sees no agent secret, not in its
/// environment (the join token and a cloud credential the agent was
/// started with) and not on disk (the node token, 0600 and the agent's),
/// and an `LD_PRELOAD` in a spec is refused at submit, naming the field,
/// with nothing written. The job prints what it sees, then execs the fake
/// trainer and completes. Switching users needs root: run as another
/// user, the agent runs trainers as itself (`allow_agent_user`) and the
/// test checks the environment alone.
#[tokio::test]
async fn e2e_tenant_a_job_runs_unprivileged_and_sees_no_agent_secret() {
    let root = node_agent::isolation::agent_uid() == 0;
    // What the job runs must be readable by the unprivileged user: the
    // test's binaries live in a private folder, so a copy goes elsewhere.
    let tools = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tools.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let trainer = tools.path().join("fake-trainer");
    std::fs::copy(bin("fake-trainer"), &trainer).unwrap();
    std::fs::set_permissions(&trainer, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run_as: &[(&str, &str)] = if root {
        &[
            ("FMSCHED_AGENT_PROCESSES__RUN_AS", "65534:65534"),
            ("FMSCHED_AGENT_PROCESSES__ALLOW_AGENT_USER", "false"),
        ]
    } else {
        &[]
    };
    let mut agent_env = vec![("AWS_SECRET_ACCESS_KEY", "agent-cloud-secret-0123")];
    agent_env.extend_from_slice(run_as);
    let c = Cluster::builder("fmsched_tenant")
        .scheduler_env(&[("FMSCHED_SCHEDULING__PROFILING", "false")])
        .agent_with("n1", 2, &agent_env)
        .start()
        .await;
    let (dir, port) = (c.dir.path(), c.port);
    // The unprivileged user passes through the test's folders to its own.
    for d in [dir.to_path_buf(), dir.join("n1")] {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let token = dir.join("n1").join("node-n1.token");
    wait_for("n1 enrolled", Duration::from_secs(20), || {
        std::fs::metadata(&token).map_err(|e| e.to_string())
    });

    // LD_PRELOAD: refused at submit, naming the field; nothing written.
    let refused = submit(
        port,
        dir,
        [(
            "preload".to_string(),
            probe_job(
                "preload",
                &format!("[\"{}\"]", trainer.display()),
                ", LD_PRELOAD: /tmp/evil.so",
            ),
        )],
    )
    .expect_err("LD_PRELOAD is refused");
    assert!(refused.contains("launch.env[\"LD_PRELOAD\"]"), "{refused}");
    assert!(jobs(port).unwrap().is_empty(), "nothing was written");

    // The probe: who it is, what it sees, whether the node token opens.
    let probe = tools.path().join("probe.sh");
    std::fs::write(
        &probe,
        format!(
            "echo \"uid=$(id -u)\"\n\
             env | sort | sed 's/^/ENV /'\n\
             if cat '{}' >/dev/null 2>&1; then echo TOKEN-READABLE; else echo TOKEN-DENIED; fi\n\
             echo \"PWD=$(pwd)\"\n\
             exec '{}'\n",
            token.display(),
            trainer.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    submit(
        port,
        dir,
        [(
            "probe".to_string(),
            probe_job("probe", &format!("[/bin/sh, \"{}\"]", probe.display()), ""),
        )],
    )
    .unwrap();
    let done = all_completed(port, 1, Duration::from_secs(90));
    let id = done.keys().next().unwrap().clone();
    let out = fmctl(port, &["logs", &id]).unwrap();

    // No agent secret in its environment, and only what it was given.
    for secret in [
        JOIN,
        "agent-cloud-secret-0123",
        "FMSCHED_JOIN_TOKEN",
        "FMSCHED_AGENT_",
    ] {
        assert!(!out.contains(secret), "{secret:?} reached the job:\n{out}");
    }
    let task_dir = out
        .lines()
        .find_map(|l| l.strip_prefix("ENV HOME="))
        .unwrap_or_else(|| panic!("HOME is the task folder:\n{out}"))
        .to_string();
    assert!(
        task_dir.starts_with(&dir.join("n1").display().to_string()),
        "{task_dir}"
    );
    assert!(out.contains(&format!("PWD={task_dir}")), "{out}");
    assert!(out.contains("ENV PATH="), "{out}");
    assert!(
        out.contains("ENV FMSCHED_CHECKPOINT_DIR="),
        "the contract's own:\n{out}"
    );
    let meta = std::fs::metadata(&task_dir).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o700, "a private task folder");
    if root {
        assert!(out.contains("uid=65534"), "runs as run_as:\n{out}");
        assert!(
            out.contains("TOKEN-DENIED"),
            "the node token stays the agent's:\n{out}"
        );
        assert_eq!(meta.uid(), 65534, "the folder is the job's user's");
        let ckpt = std::fs::metadata(std::path::Path::new(&task_dir).join("checkpoints")).unwrap();
        assert_eq!((ckpt.uid(), ckpt.mode() & 0o777), (65534, 0o700));
    } else {
        eprintln!("not root: the agent cannot switch users; checked the environment only");
    }
}
