//! End-to-end tests: prompt.

use std::time::{Duration, Instant};

use fmsched_integration::*;
use serde_json::Value;
use sqlx::Connection;

use crate::{
    TrainersOf, agent_with, all_completed, events_saying, fmctl, job_named, job_yaml, jobs,
    metric_value, scheduler_env, scrape, submit, wait_up,
};

/// A prompt-tuning job (PromptTuner's request kind) through `fmctl`: a
/// setting it cannot act on is refused naming the field and stores
/// nothing; an accepted one trains a prompt only (the trainer gets
/// `petl=prompt_tuning`, the virtual tokens and the initial prompt), and
/// its output is the tuned prompt, shown by `fmctl job`. It takes no
/// profiling run.
#[tokio::test]
async fn e2e_prompt_a_prompt_tuning_job_returns_its_tuned_prompt() {
    let c = Cluster::builder("fmsched_prompt_kind")
        .agent("node-a")
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let manifest = |name: &str, extra: &str| {
        format!(
            "kind: prompt_tuning\nname: {name}\nmodel: gpt2\n\
             dataset: {{ uri: file:///data/samsum, task: samsum, num_samples: 3200, objective: causal-lm }}\n\
             hyperparameters: {{ global_batch_size: 16, learning_rate: 0.01{extra} }}\n\
             target: {{ max_iterations: 400 }}\n\
             resources: {{ min_gpus: 1, max_gpus: 2 }}\n\
             prompt_tuning: {{ num_virtual_tokens: 8, initial_prompt: \"Summarize the dialogue:\" }}\n\
             launch:\n  command: [\"{}\"]\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"200\" }}\n",
            bin("fake-trainer").display()
        )
    };
    let e = submit(
        port,
        dir.path(),
        [("lora".to_string(), manifest("lora", ", petl: lora"))],
    )
    .unwrap_err();
    assert!(
        e.contains("spec.hyperparameters.petl") && e.contains("prompt"),
        "{e}"
    );
    assert!(
        jobs(port).unwrap().is_empty(),
        "a refused spec stores nothing"
    );
    submit(
        port,
        dir.path(),
        [("prompt".to_string(), manifest("prompt", ""))],
    )
    .expect("submit");
    let done = all_completed(port, 1, Duration::from_secs(120));
    let (id, (_, output)) = done.into_iter().next().unwrap();
    assert!(output.ends_with("prompt.json"), "{output}");
    let prompt: Value = serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    assert_eq!(prompt["num_virtual_tokens"], 8, "{prompt}");
    assert_eq!(
        prompt["initial_prompt"], "Summarize the dialogue:",
        "{prompt}"
    );
    assert_eq!(prompt["job_id"], id.as_str(), "{prompt}");
    let shown = fmctl(port, &["job", &id]).unwrap();
    assert!(
        shown.contains("Kind:        prompt tuning")
            && shown.contains(&format!("Prompt:      {output}")),
        "{shown}"
    );
    let err = fmctl(port, &["logs", &id, "--stderr"]).unwrap();
    assert!(err.contains("petl=prompt_tuning"), "{err}");
    // No profiling run: its bound is its iterations on the table's step
    // time (PromptTuner); it went from submitted to queued to running.
    // Which writes the queued step races: the lane ("accepted for
    // scheduling") or a round that saw the job first, holding it back for
    // the lane ("waiting for GPUs"; seen once under the full parallel run).
    assert!(
        events_saying(db, "profiling").await.is_empty(),
        "{:?}",
        events_saying(db, "").await
    );
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let path: Vec<String> = sqlx::query_scalar(
        "SELECT to_state::text FROM job_events WHERE to_state IS NOT NULL ORDER BY seq",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(
        path,
        ["submitted", "queued", "running", "completed"],
        "{:?}",
        events_saying(db, "").await
    );
}

/// The Prompt Bank (PromptTuner §4.4.3) live: each completed prompt job's
/// tuned prompt is filed in its model's bank in Postgres with the features
/// its trainer reported; a later prompt job without an initial prompt gets
/// the bank's two-layer index, its trainer scores the candidates and starts
/// from the best (the prompt of the same task), and an event says which. A
/// job with its own initial prompt gets no bank. Past the cap, one prompt
/// is evicted.
#[tokio::test]
async fn e2e_prompt_a_request_starts_from_the_best_prompt_in_the_bank() {
    let c = Cluster::builder("fmsched_prompt_bank")
        .scheduler_env(&[("FMSCHED_SCHEDULING__PROMPT_BANK_CAP", "3")])
        .metrics()
        .agent("node-a")
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let mport = c.metrics_port.expect("metrics asked for");
    let manifest = |name: &str, task: &str, prompt: &str| {
        format!(
            "kind: prompt_tuning\nname: {name}\nmodel: gpt2\n\
             dataset: {{ uri: file:///data/{task}, task: {task}, num_samples: 3200, objective: causal-lm }}\n\
             hyperparameters: {{ global_batch_size: 16, learning_rate: 0.01 }}\n\
             target: {{ max_iterations: 300 }}\n\
             resources: {{ min_gpus: 1, max_gpus: 1 }}\n\
             prompt_tuning: {{ num_virtual_tokens: 8{prompt} }}\n\
             launch:\n  command: [\"{}\"]\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"200\" }}\n",
            bin("fake-trainer").display()
        )
    };
    let id = |name: &str| job_named(port, name).unwrap().0;
    // Two prompts of two tasks, tuned from random embeddings (empty bank).
    submit(
        port,
        dir.path(),
        [
            ("dialogue".to_string(), manifest("dialogue", "samsum", "")),
            ("code".to_string(), manifest("code", "mbpp", "")),
        ],
    )
    .expect("submit");
    let done = all_completed(port, 2, Duration::from_secs(120));
    let bank = |db: String| async move {
        let mut c = sqlx::PgConnection::connect(&db_url(&db)).await.unwrap();
        sqlx::query_as::<_, (String, String, String, i32)>(
            "SELECT job_id::text, model, location, cardinality(features) FROM prompt_bank ORDER BY seq",
        )
        .fetch_all(&mut c)
        .await
        .unwrap()
    };
    let filed = bank(db.to_string()).await;
    assert_eq!(filed.len(), 2, "{filed:?}");
    for (job, model, location, features) in &filed {
        assert_eq!(model, "gpt2");
        assert_eq!(
            location, &done[job].1,
            "the bank points at the job's output"
        );
        assert_eq!(*features, 16, "the fake trainer's 16 features");
    }
    for job in done.keys() {
        let err = fmctl(port, &["logs", job, "--stderr"]).unwrap();
        assert!(
            !err.contains("Prompt Bank"),
            "an empty bank is not sent:\n{err}"
        );
    }
    // A dialogue request without an initial prompt starts from the
    // dialogue prompt; one with its own initial prompt keeps it.
    submit(
        port,
        dir.path(),
        [
            (
                "dialogue-2".to_string(),
                manifest("dialogue-2", "samsum", ""),
            ),
            (
                "own".to_string(),
                manifest("own", "samsum", ", initial_prompt: \"Summarize:\""),
            ),
        ],
    )
    .expect("submit");
    all_completed(port, 4, Duration::from_secs(120));
    let err = fmctl(port, &["logs", &id("dialogue-2"), "--stderr"]).unwrap();
    assert!(
        err.contains(&format!(
            "Prompt Bank: starting from job {}'s prompt",
            id("dialogue")
        )) && err.contains("2 of 2 prompts scored"),
        "the dialogue prompt wins over the code prompt:\n{err}"
    );
    let said = events_saying(db, "initial prompt from the Prompt Bank").await;
    assert_eq!(said.len(), 1, "one event, once: {said:?}");
    assert_eq!(said[0].0, id("dialogue-2"));
    assert!(
        said[0].1.contains(&id("dialogue")) && said[0].1.contains("2 of 2 prompts scored"),
        "{said:?}"
    );
    let own = fmctl(port, &["logs", &id("own"), "--stderr"]).unwrap();
    assert!(
        !own.contains("Prompt Bank"),
        "its own initial prompt wins:\n{own}"
    );
    // Four tuned prompts, a cap of 3: one was evicted.
    let filed = bank(db.to_string()).await;
    assert_eq!(filed.len(), 3, "{filed:?}");
    let m = scrape(mport).await;
    assert_eq!(metric_value(&m, "fmsched_prompt_bank_filed_total"), 4.0);
    assert_eq!(metric_value(&m, "fmsched_prompt_bank_evicted_total"), 1.0);
    assert_eq!(
        metric_value(&m, "fmsched_prompt_bank_prompts{model=\"gpt2\"}"),
        3.0
    );
}

/// Seconds between two events of a job: the first whose message contains
/// `from` and the first after it containing `to`.
async fn event_gap(db: &str, job: &str, from: &str, to: &str) -> f64 {
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let rows: Vec<(String, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT message, at FROM job_events WHERE job_id = $1::uuid ORDER BY seq")
            .bind(job)
            .fetch_all(&mut c)
            .await
            .unwrap();
    let a = rows
        .iter()
        .position(|r| r.0.contains(from))
        .unwrap_or_else(|| panic!("{from}: {rows:?}"));
    let b = rows[a..]
        .iter()
        .find(|r| r.0.contains(to))
        .unwrap_or_else(|| panic!("{to}: {rows:?}"));
    (b.1 - rows[a].1).num_milliseconds() as f64 / 1e3
}

/// The value of a metric sample (labels included in `name`), if present.
fn metric_opt(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// PromptTuner live: a long fine-tuning job holds two of the node's four
/// GPUs while prompt-tuning requests come. The first gpt2 request starts
/// cold (its log shows the weight load); once done its process stays warm
/// (the warm-pool gauge says so). Of a burst of three more, one is handed
/// to that warm process (no weight load in its log); one starts cold on
/// the last free GPU (it may not wait for the busy one longer than a cold
/// start takes); the third finds no free GPU and starts on the first warm
/// process that frees up. Idle warm processes go back to the cold pool
/// after the idle release (3 s here). The long job is never stopped or
/// moved. Prints the lane's decision latency and the warm and cold start
/// latencies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_prompt_a_second_request_starts_warm_and_idle_warm_gpus_are_released() {
    let db = TestDb::create("fmsched_prompt_warm").await;
    let dir = tempfile::tempdir().unwrap();
    let _trainers = TrainersOf::new(dir.path());
    let (port, mport, aport) = (free_port(), free_port(), free_port());
    let _sched = scheduler_env(
        &db,
        port,
        dir.path(),
        Some(mport),
        &[
            ("FMSCHED_SCHEDULING__PROMPT_WARM_IDLE_RELEASE", "3s"),
            ("FMSCHED_SCHEDULING__MERGING", "false"),
        ],
    );
    wait_up("scheduler up", port);
    let _a = agent_with("node-a", port, dir.path(), Some(aport));
    submit(
        port,
        dir.path(),
        [(
            "long".to_string(),
            job_yaml("long", "qqp", 50_000_000, 2).replace("min_gpus: 1", "min_gpus: 2"),
        )],
    )
    .expect("submit");
    let state = |name: &str| job_named(port, name).map(|j| j.1).unwrap_or_default();
    wait_for("the long job runs", Duration::from_secs(60), || {
        (state("long") == "running")
            .then_some(())
            .ok_or(state("long"))
    });
    let long = job_named(port, "long").unwrap().0;
    let prompt = |name: &str| {
        format!(
            "kind: prompt_tuning\nname: {name}\nmodel: gpt2\n\
             dataset: {{ uri: file:///data/samsum, task: samsum, num_samples: 3200, objective: causal-lm }}\n\
             hyperparameters: {{ global_batch_size: 16, learning_rate: 0.01 }}\n\
             target: {{ max_iterations: 300 }}\n\
             resources: {{ min_gpus: 1, max_gpus: 1 }}\n\
             prompt_tuning: {{ num_virtual_tokens: 8, initial_prompt: \"Summarize:\" }}\n\
             launch:\n  command: [\"{}\"]\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"10\" }}\n",
            bin("fake-trainer").display()
        )
    };
    let completed = |name: &str| {
        let name = name.to_string();
        move || {
            let s = state(&name);
            assert_ne!(s, "failed", "{name} failed");
            (s == "completed").then_some(()).ok_or(s)
        }
    };
    submit(port, dir.path(), [("first".to_string(), prompt("first"))]).expect("submit");
    wait_for(
        "the first request completes",
        Duration::from_secs(90),
        completed("first"),
    );
    let first = job_named(port, "first").unwrap().0;
    let log = |id: &str| fmctl(port, &["logs", id, "--stderr"]).unwrap();
    let cold_log = log(&first);
    assert!(
        cold_log.contains("loading the runtime and the weights of gpt2"),
        "{cold_log}"
    );
    // Its process stays warm: the scheduler's gauge says so.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric_opt(
        &scrape(mport).await,
        "fmsched_prompt_warm_gpus{model=\"gpt2\"}",
    ) != Some(1.0)
    {
        assert!(Instant::now() < deadline, "no warm gpt2 GPU reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A burst of three: one takes the warm process, one starts cold on the
    // last free GPU, one waits for a warm process to free up.
    submit(
        port,
        dir.path(),
        [
            ("second".to_string(), prompt("second")),
            ("third".to_string(), prompt("third")),
            ("fourth".to_string(), prompt("fourth")),
        ],
    )
    .expect("submit");
    for n in ["second", "third", "fourth"] {
        wait_for(
            "the burst completes",
            Duration::from_secs(120),
            completed(n),
        );
    }
    let said = events_saying(&db, "prompt lane: started").await;
    assert_eq!(said.len(), 4, "{said:?}");
    let warm: Vec<String> = said
        .iter()
        .filter(|e| e.1.contains("on a warm process of its model"))
        .map(|e| e.0.clone())
        .collect();
    let id = |name: &str| job_named(port, name).unwrap().0;
    assert_eq!(warm, vec![id("second"), id("fourth")], "{said:?}");
    let (warm_job, cold_job) = (id("second"), id("third"));
    let warm_log = log(&warm_job);
    for w in &warm {
        let l = log(w);
        assert!(
            l.contains(&format!("warm start of job {w}")) && !l.contains("loading the runtime"),
            "a warm start loads no weights:\n{l}"
        );
    }
    assert!(log(&cold_job).contains("loading the runtime and the weights of gpt2"));
    let m = scrape(mport).await;
    assert_eq!(
        metric_value(&m, "fmsched_prompt_starts_total{start=\"warm\"}"),
        2.0
    );
    assert_eq!(
        metric_value(&m, "fmsched_prompt_starts_total{start=\"cold\"}"),
        2.0
    );
    // Idle warm processes go back after the release: both gpt2 processes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = scrape(aport).await;
        if metric_value(&a, "fmsched_agent_warm_released_total") >= 2.0 {
            assert_eq!(metric_value(&a, "fmsched_agent_warm_starts_total"), 2.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "idle warm processes never released:\n{a}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The long job ran throughout: never stopped, moved or re-queued.
    assert_eq!(state("long"), "running");
    let mut c = sqlx::PgConnection::connect(&db_url(&db)).await.unwrap();
    let (changes,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM job_events WHERE job_id = $1::uuid AND kind = 'state_changed'
         AND seq > (SELECT min(seq) FROM job_events WHERE job_id = $1::uuid AND to_state = 'running')",
    )
    .bind(&long)
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(changes, 0, "the long job was disturbed");
    // Figures: the lane's decision (submission → started) and the start
    // latency as the trainer saw it (start-up → first step), warm and cold.
    let first_step = |log: &str| -> f64 {
        log.lines()
            .find_map(|l| {
                l.split("first step ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(f64::NAN)
    };
    let m = scrape(mport).await;
    let decisions = metric_value(&m, "fmsched_prompt_decisions_total");
    println!(
        "prompt lane: {decisions} decisions, mean {:.2} ms, max {:.2} ms (whole passes: observe, decide, \
         commit, push: mean {:.1} ms); submission → started: warm {:.3} s, cold {:.3} s; start-up → \
         first step (compression 10): warm {:.3} s, cold {:.3} s",
        1e3 * metric_value(&m, "fmsched_prompt_decision_seconds_sum") / decisions,
        1e3 * metric_value(&m, "fmsched_prompt_decision_seconds_max"),
        1e3 * metric_value(&m, "fmsched_prompt_pass_seconds_sum") / decisions,
        event_gap(&db, &warm_job, "submitted", "prompt lane: started").await,
        event_gap(&db, &cold_job, "submitted", "prompt lane: started").await,
        first_step(&warm_log),
        first_step(&log(&cold_job)),
    );
    assert!(first_step(&warm_log) < first_step(&log(&cold_job)));
}
