//! Tests of `workload`.

use super::*;

fn tasks() -> Vec<(String, String)> {
    vec![
        ("roberta-base".into(), "rte".into()),
        ("vit-base".into(), "cifar100".into()),
    ]
}

/// The `slo` columns: the class by the one default rule, a deadline as
/// seconds or as a multiple of the time alone, and errors naming the
/// line and the field; the columns survive a round trip.
#[test]
fn slo_columns_and_the_default_class_rule() {
    let head = "name,submit_s,model,task,gpus,batch,sharing,pipeline,slo,deadline_s,deadline_x\n";
    let text = format!(
        "{head}a,0,roberta-base,rte,1,32,1,0,,,1.5\nb,1,roberta-base,rte,1,32,1,0,soft_slo,600,\n\
         c,2,roberta-base,rte,1,32,1,0,,,\nd,3,roberta-base,rte,1,32,1,0,best_effort,900,\n"
    );
    let jobs = parse("w.csv", &text, None, &[]).unwrap();
    let class: Vec<SloClass> = jobs.iter().map(|j| j.slo.class()).collect();
    assert_eq!(
        class,
        [
            SloClass::Slo,
            SloClass::SoftSlo,
            SloClass::BestEffort,
            SloClass::BestEffort
        ]
    );
    assert_eq!(jobs[0].slo.deadline_after(100.0), Some(150.0));
    assert_eq!(jobs[1].slo.deadline_after(100.0), Some(600.0));
    assert_eq!(parse("w.csv", &to_csv(&jobs), None, &[]).unwrap(), jobs);
    for (row, says) in [
        (
            "e,0,roberta-base,rte,1,32,1,0,slo,,",
            "needs deadline_s or deadline_x",
        ),
        (
            "e,0,roberta-base,rte,1,32,1,0,urgent,60,",
            "slo: \"urgent\"",
        ),
        ("e,0,roberta-base,rte,1,32,1,0,,60,2", "give one of them"),
        ("e,0,roberta-base,rte,1,32,1,0,,0,", "must be > 0"),
    ] {
        let e = parse("w.csv", &format!("{head}{row}\n"), None, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("w.csv line 2") && e.contains(says), "{e}");
    }
}

/// `min_gpus`: the fewest GPUs a job runs on (one when empty), written
/// back as read; more than its `gpus` names the column and line.
#[test]
fn min_gpus_column() {
    let head = "name,submit_s,model,task,gpus,batch,sharing,pipeline,min_gpus\n";
    let text = format!("{head}a,0,roberta-base,rte,8,32,1,0,5\nb,1,roberta-base,rte,2,32,1,0,\n");
    let jobs = parse("w.csv", &text, None, &[]).unwrap();
    assert_eq!(
        jobs.iter()
            .map(|j| (j.min_gpus, j.max_gpus))
            .collect::<Vec<_>>(),
        [(5, 8), (0, 2)]
    );
    assert_eq!(parse("w.csv", &to_csv(&jobs), None, &[]).unwrap(), jobs);
    let e = parse(
        "w.csv",
        &format!("{head}c,0,roberta-base,rte,2,32,1,0,3\n"),
        None,
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("w.csv line 2") && e.contains("min_gpus: 3 is more than"),
        "{e}"
    );
}

/// `--slo-mix`: every SLO job gets a deadline of 1.1-2 x its time alone;
/// MIX1 has strict and best-effort jobs only, MIX2 soft ones too.
#[test]
fn slo_mixes() {
    let base = parse(
        "w.csv",
        &format!(
            "name,submit_s,model,task,gpus,batch,sharing,pipeline\n{}",
            (0..200)
                .map(|k| format!("j{k},{k},roberta-base,rte,1,32,1,0\n"))
                .collect::<String>()
        ),
        None,
        &[],
    )
    .unwrap();
    for (mix, classes) in [
        (SloMix::Slo, vec![SloClass::Slo]),
        (SloMix::Mix1, vec![SloClass::Slo, SloClass::BestEffort]),
        (
            SloMix::Mix2,
            vec![SloClass::Slo, SloClass::SoftSlo, SloClass::BestEffort],
        ),
    ] {
        let mut jobs = base.clone();
        assign_slos(&mut jobs, mix, 4);
        for c in &classes {
            assert!(jobs.iter().any(|j| j.slo.class() == *c), "{mix:?} {c:?}");
        }
        for j in &jobs {
            assert!(classes.contains(&j.slo.class()), "{mix:?}");
            match j.slo.deadline_x {
                Some(x) => assert!((1.1..=2.0).contains(&x) && j.slo.class().has_deadline()),
                None => assert_eq!(j.slo.class(), SloClass::BestEffort),
            }
        }
        // About a fifth stop on a metric target, of every class, with a
        // maximum up to 1/(1 - 0.31) of their work; the columns survive
        // a round trip.
        let metric: Vec<f64> = jobs.iter().filter_map(|j| j.max_work_x).collect();
        assert!(
            (25..=55).contains(&metric.len()),
            "{mix:?} {}",
            metric.len()
        );
        assert!(
            metric.iter().all(|x| (1.0..=1.45).contains(x)),
            "{metric:?}"
        );
        assert!(
            metric.iter().any(|&x| x > 1.29),
            "both targets drawn: {metric:?}"
        );
        for c in &classes {
            assert!(
                jobs.iter()
                    .any(|j| j.max_work_x.is_some() && j.slo.class() == *c),
                "{mix:?} {c:?}"
            );
        }
        assert_eq!(parse("w.csv", &to_csv(&jobs), None, &[]).unwrap(), jobs);
    }
    // The stopping criteria are a draw of their own: the deadlines are
    // what the same seed gave before them.
    let mut jobs = base.clone();
    assign_slos(&mut jobs, SloMix::Mix1, 4);
    let mut rng = crate::generate::Rng::new(4 ^ 0x5107);
    for j in &jobs {
        let (u, x) = (rng.f64(), 1.1 + 0.9 * rng.f64());
        assert_eq!(j.slo.class() == SloClass::Slo, u < 0.5);
        if u < 0.5 {
            assert_eq!(j.slo.deadline_x, Some((x * 1000.0).round() / 1000.0));
        }
    }
    let e = parse(
        "w.csv",
        "name,submit_s,model,task,gpus,batch,sharing,pipeline,max_work_x\nj,0,roberta-base,rte,1,32,1,0,0.9\n",
        None,
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 2") && e.contains("max_work_x: 0.9"), "{e}");
    assert_eq!("MIX2".parse::<SloMix>(), Ok(SloMix::Mix2));
    assert!("mix3".parse::<SloMix>().unwrap_err().contains("mix1"));
}

#[test]
fn reads_every_format() {
    let f = parse(
        "w.csv",
        "name,submit_s,model,task,gpus,batch,sharing,pipeline,epochs\nb,10,roberta-base,rte,2,32,1,0,\na,5,vit-base,cifar100,1,64,0,0,3.5\n",
        None,
        &[],
    )
    .unwrap();
    assert_eq!(f.len(), 2);
    assert_eq!(
        (f[0].name.as_str(), f[0].epochs, f[0].sharing),
        ("a", Some(3.5), false)
    );
    let t = parse(
        "t.csv",
        "name,submission_time,application,num_gpus,target_batch_size,target_lr,target_gradient_steps,target_metric\n\
         vit@frgfm#imagenette-0,45,vit@frgfm#imagenette,1,48,4e-4,1,0.99\n",
        None,
        &[],
    )
    .unwrap();
    assert_eq!(t[0].task, "frgfm/imagenette");
    assert_eq!(t[0].curve_key.as_deref(), Some("lr=4e-4,grad_accum=1"));
    let h = parse(
        "h.csv",
        "job_id,user,vc,jobname,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n\
         j1,u,vc,\"a,b\",8,16,1,COMPLETED,2020-04-01 00:00:10,x,y,3600,0\n\
         j2,u,vc,n,0,16,1,COMPLETED,2020-04-01 00:00:00,x,y,3600,0\n\
         j3,u,vc,n,1,16,1,COMPLETED,2020-04-01 00:01:10,x,y,60,0\n",
        None,
        &tasks(),
    )
    .unwrap();
    assert_eq!(h.len(), 2, "CPU-only jobs are skipped");
    assert_eq!(
        (h[0].submit_s, h[0].gpus, h[0].trace_gpu_s),
        (0.0, 8, Some(28_800.0))
    );
    assert_eq!(h[1].submit_s, 60.0);
    let p = parse(
        "p.csv",
        "jobid,submitted_time,num_gpus,duration_s\nx,100,2,50\ny,40,1,10\n",
        None,
        &tasks(),
    )
    .unwrap();
    assert_eq!((p[0].name.as_str(), p[0].submit_s), ("y", 0.0));
}

/// `queue`, `priority` and `preemptible` columns: defaults when empty
/// or absent, a bad priority named with its line, a round trip.
#[test]
fn queue_columns_are_read_and_checked() {
    let head = "name,submit_s,model,task,gpus,batch,sharing,pipeline,queue,priority,preemptible\n";
    let text =
        format!("{head}a,0,roberta-base,rte,1,32,1,0,nlp,5,0\nb,1,roberta-base,rte,1,32,1,0,,,\n");
    let jobs = parse("w.csv", &text, None, &[]).unwrap();
    assert_eq!(
        jobs[0].queueing,
        Queueing {
            queue: "nlp".into(),
            priority: 5,
            preemptible: false
        }
    );
    assert_eq!(jobs[1].queueing, Queueing::default());
    assert_eq!(parse("w.csv", &to_csv(&jobs), None, &[]).unwrap(), jobs);
    let e = parse(
        "w.csv",
        &format!("{head}a,0,roberta-base,rte,1,32,1,0,nlp,5000,0\n"),
        None,
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("line 2: priority"), "{e}");
}

#[test]
fn malformed_rows_name_file_and_line() {
    let e = parse(
        "w.csv",
        "name,submit_s,model,task,gpus,batch,sharing,pipeline\na,1,m,t,1,8,1,0\nb,x,m,t,1,8,1,0\n",
        None,
        &[],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "w.csv line 3: submit_s: \"x\" is not a number"
    );
    let e = parse(
        "w.csv",
        "name,submit_s,model,task,gpus,batch,sharing,pipeline\na,1,m,t\n",
        None,
        &[],
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "w.csv line 2: 4 fields, the header has 8");
    let e = parse(
        "w.csv",
        "name,submit_s,model,task,gpus,batch,sharing,pipeline\na,1,m,t,0,8,1,0\n",
        None,
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");
    let e = parse(
        "w.csv",
        "name,submit_s,model,task,gpus,batch,sharing,pipeline\na,1,m,t,1,8,maybe,0\n",
        None,
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("sharing"), "{e}");
    let e = parse(
        "t.csv",
        "name,submission_time,application,num_gpus,target_batch_size,target_lr,target_gradient_steps,target_metric\nx,1,nomodel,1,8,1,1,0.5\n",
        None,
        &[],
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("t.csv line 2: application"),
        "{e}"
    );
    assert!(parse("e.csv", "", None, &[]).is_err());
    assert!(
        parse("u.csv", "a,b\n1,2\n", None, &[])
            .unwrap_err()
            .to_string()
            .contains("--format")
    );
    let e = parse(
        "h.csv",
        "job_id,gpu_num,submit_time,duration\nj,1,yesterday,5\n",
        None,
        &tasks(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("line 2") && e.to_string().contains("submit_time"),
        "{e}"
    );
}

/// The shipped samples of each published layout (`fmsim/data/formats`).
fn shipped(name: &str) -> Vec<WorkloadJob> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fmsim/data/formats")
        .join(name);
    read(&path, None, &tasks()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn published_layouts_read_as_published() {
    // Pollux/AdaptDL: arrivals, replicas and batches as given; one task
    // per application (both cifar10 jobs share theirs).
    let p = shipped("pollux-workload.csv");
    assert_eq!(p.len(), 5);
    assert_eq!(
        (p[1].name.as_str(), p[1].submit_s, p[1].gpus, p[1].batch),
        ("sweep-01", 310.0, 2, 24)
    );
    assert_eq!(p[0].task, p[2].task, "one task per application");
    assert!(
        p.iter()
            .all(|j| j.trace_gpu_s.is_none() && j.epochs.is_none())
    );
    // Philly's JSON log: killed jobs and jobs that never ran (or never
    // ended) are left out; GPUs of the last attempt; run time summed
    // over the attempts; arrivals from the first.
    let j = shipped("philly-job-log.json");
    let names: Vec<&str> = j.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["application_0001_a", "application_0002_b"]);
    assert_eq!((j[0].submit_s, j[0].gpus), (0.0, 4));
    assert_eq!(j[0].trace_gpu_s, Some(4.0 * 3600.0));
    assert_eq!((j[1].submit_s, j[1].gpus), (600.0, 4));
    assert_eq!(
        j[1].trace_gpu_s,
        Some(4.0 * 1800.0),
        "10 + 20 minutes on 4 GPUs"
    );
    // Helios: CPU-only and cancelled jobs are left out.
    let h = shipped("helios-cluster-log.csv");
    let names: Vec<&str> = h.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["h-001", "h-003", "h-005"]);
    assert_eq!(h[2].submit_s, 1800.0);
    // The format is told from the content; --format adaptdl is Pollux's.
    assert_eq!("adaptdl".parse::<Format>(), Ok(Format::Pollux));
    assert_eq!("titan".parse::<Format>(), Ok(Format::Titan));
}

#[test]
fn malformed_published_layouts_name_where() {
    let e = parse(
        "p.csv",
        "name,time,application,num_replicas,batch_size\na,0,bert,2,8\nb,10,bert,0,8\n",
        None,
        &tasks(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "p.csv line 3: num_replicas and batch_size must be > 0"
    );
    let e = parse(
        "l.json",
        "[{\"jobid\": \"x\",\n  \"status\": }]",
        None,
        &tasks(),
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("l.json line 2: not JSON"), "{e}");
    let e = parse(
        "l.json",
        r#"[{"jobid": "x", "status": "Pass", "submitted_time": "soon", "attempts": []}]"#,
        None,
        &tasks(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "l.json: job 1 (x): submitted_time \"soon\" is not a time"
    );
    let e = parse(
        "l.json",
        r#"[{"jobid": "x", "submitted_time": "2017-10-02 08:00:00",
             "attempts": [{"start_time": 5, "end_time": null}]}]"#,
        None,
        &tasks(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("job 1 (x): attempt 1: start_time 5"),
        "{e}"
    );
    let e = parse("l.json", "[]", Some(Format::Helios), &tasks()).unwrap_err();
    assert!(e.to_string().contains("--format philly"), "{e}");
}

#[test]
fn generated_csv_reads_back() {
    let jobs = parse(
        "w.csv",
        "name,submit_s,model,task,gpus,batch,sharing,pipeline,epochs\na,5,vit-base,cifar100,1,64,0,1,3.5\n",
        None,
        &[],
    )
    .unwrap();
    assert_eq!(parse("again.csv", &to_csv(&jobs), None, &[]).unwrap(), jobs);
}

#[test]
fn timestamps_parse() {
    assert_eq!(parse_time("1970-01-02 00:00:00"), Some(86_400.0));
    assert_eq!(parse_time("12.5"), Some(12.5));
    assert_eq!(parse_time("2020-13-01"), None);
}
