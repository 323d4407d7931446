//! `fmsim bench-solver` and `fmsim bench-prompttuner`: timings of the
//! Ymir MILP, the partitioned solve, PromptTuner's 50 ms pass and the
//! Prompt Bank's index.

use std::path::Path;
use std::time::Instant;

use anyhow::bail;
use fmsched_estimator::analytic;
use fmsched_estimator::lut::Lut;
use fmsched_sim::catalog::Catalog;
use fmsched_sim::engine::SimConfig;
use fmsched_sim::generate::{GenConfig, generate};
use fmsched_sim::report;
use fmsched_sim::workload::WorkloadJob;

use crate::cmd::fidelity::{FM1_MODELS, anchor_workload, job_epochs};
use crate::cmd::setup::{load_profiles, policy, simulate};

/// `fmsim bench-prompttuner`: each decision is one pass of the 50 ms loop
/// (`prompttuner::decide`: Algorithm 1 on the warm pools, Algorithm 2 on
/// the cold pool, the best-effort rest) over the whole queue; requests of
/// 1–30 minutes of work on one GPU, `work / A^0.9` on `A` GPUs (up to 16),
/// SLOs of 0.5–1.5× their one-GPU time plus the cold start.
pub(crate) fn bench_prompttuner(requests: usize, models: usize, rounds: usize) {
    use fmsched_core::policy::prompttuner::{
        LaneNode, LaneRequest, Request, WarmPool, decide, place_lane,
    };
    let mut rng = fmsched_sim::generate::Rng::new(7);
    let models = models.max(1);
    let cold_start: Vec<f64> = (0..models).map(|_| 20.0 + 40.0 * rng.f64()).collect();
    let reqs: Vec<Request> = (0..requests)
        .map(|k| {
            let m = rng.below(models);
            let work = 60.0 + 1740.0 * rng.f64();
            let bound_s: Vec<f64> = (1..=16)
                .map(|a: i32| work / f64::from(a).powf(0.9))
                .collect();
            Request {
                id: format!("r{k}"),
                model: m,
                slo_s: cold_start[m] + work * (0.5 + rng.f64()),
                bound_s,
                gpus: 1,
            }
        })
        .collect();
    let pools: Vec<WarmPool> = (0..models)
        .map(|_| WarmPool {
            idle: rng.below(9) as u32,
            busy_until: (0..rng.below(9)).map(|_| 600.0 * rng.f64()).collect(),
        })
        .collect();
    let mut ms = Vec::with_capacity(rounds);
    let mut served = 0usize;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        let d = decide(&reqs, &pools, 64, &cold_start, 0.0);
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        served = (0..reqs.len())
            .filter(|&i| d.warm[i] + d.cold[i] > 0 || d.delayed[i])
            .count();
    }
    ms.sort_by(f64::total_cmp);
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    println!(
        "prompttuner decision: {requests} queued requests, {models} models: mean {mean:.3} ms, p99 {:.3} ms, max {:.3} ms over {} decisions ({served} requests started or delayed)",
        report::percentile(&ms, 99.0),
        ms.last().copied().unwrap_or(f64::NAN),
        ms.len()
    );
    // The live lane's pass: the same decision, then concrete GPUs on 16
    // nodes of 8 (each model's idle warm GPUs as one-GPU warm processes
    // spread over them, 64 free GPUs).
    let names: Vec<String> = (0..models).map(|m| format!("model-{m}")).collect();
    let mut nodes: Vec<LaneNode> = (0..16)
        .map(|_| LaneNode {
            family: "A100".into(),
            ..LaneNode::default()
        })
        .collect();
    let mut next = 0usize;
    for (m, p) in pools.iter().enumerate() {
        for _ in 0..p.idle {
            let n = next % nodes.len();
            let g = (nodes[n].warm.len() + nodes[n].free.len()) as u32;
            nodes[n].warm.push((names[m].clone(), vec![g]));
            next += 1;
        }
    }
    for k in 0..64 {
        let n = (next + k) % nodes.len();
        let g = (nodes[n].warm.len() + nodes[n].free.len()) as u32;
        nodes[n].free.push(g);
    }
    let lane: Vec<LaneRequest> = reqs
        .iter()
        .map(|r| LaneRequest {
            request: r.clone(),
            families: Vec::new(),
        })
        .collect();
    let busy: Vec<Vec<f64>> = pools.iter().map(|p| p.busy_until.clone()).collect();
    let mut ms = Vec::with_capacity(rounds);
    let mut started = 0usize;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        let plan = place_lane(&lane, &nodes, &names, &busy, &cold_start, 0.0);
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        started = plan.starts.len();
    }
    ms.sort_by(f64::total_cmp);
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    println!(
        "prompt lane pass (decision + GPUs on 16 nodes): {requests} queued requests, {models} models: mean {mean:.3} ms, p99 {:.3} ms, max {:.3} ms over {} passes ({started} requests placed)",
        report::percentile(&ms, 99.0),
        ms.last().copied().unwrap_or(f64::NAN),
        ms.len()
    );
}

/// The Prompt Bank's index over `prompts` random activation features
/// around 50 directions: build time, and a lookup's scorings (the score is
/// the cosine distance to a random task, standing in for Eq. 4.1's loss).
pub(crate) fn bench_prompt_bank(prompts: usize, features: usize) {
    use fmsched_core::policy::prompttuner::{
        Candidate, PromptBank, cosine_distance, index_features,
    };
    let mut rng = fmsched_sim::generate::Rng::new(11);
    let features = features.max(2);
    let centres: Vec<Vec<f64>> = (0..50)
        .map(|_| (0..features).map(|_| rng.f64() - 0.5).collect())
        .collect();
    let cands: Vec<Candidate> = (0..prompts)
        .map(|k| {
            let c = &centres[rng.below(centres.len())];
            Candidate {
                id: format!("p{k}"),
                features: c.iter().map(|x| x + 0.1 * (rng.f64() - 0.5)).collect(),
            }
        })
        .collect();
    // As the scheduler builds it: over the hashed features; the lookup
    // scores each candidate on its own features.
    let raw: std::collections::HashMap<String, Vec<f64>> = cands
        .iter()
        .map(|c| (c.id.clone(), c.features.clone()))
        .collect();
    let t = Instant::now();
    let hashed: Vec<Candidate> = cands
        .iter()
        .map(|c| Candidate {
            id: c.id.clone(),
            features: index_features(&c.features),
        })
        .collect();
    let bank = PromptBank::build(hashed, None, prompts);
    let build_s = t.elapsed().as_secs_f64();
    let task: Vec<f64> = (0..features).map(|_| rng.f64() - 0.5).collect();
    let (found, scored) = bank
        .lookup(|c| cosine_distance(&raw[&c.id], &task))
        .expect("a bank with prompts");
    let exhaustive = cands
        .iter()
        .map(|c| cosine_distance(&c.features, &task))
        .fold(f64::INFINITY, f64::min);
    println!(
        "prompt bank: {prompts} prompts of {features} features in {} clusters, built in {build_s:.2} s; a lookup scores {scored} of {prompts} prompts; its pick is {:.4} from the task against {exhaustive:.4} for the exhaustive best",
        bank.clusters(),
        cosine_distance(&raw[&found.id], &task)
    );
}

pub(crate) fn bench_solver(dir: Option<&Path>, jobs: usize) -> anyhow::Result<()> {
    let ymir = policy("ymir")?;
    let mut cases: Vec<(String, SimConfig, Lut, Catalog, Vec<WorkloadJob>)> = Vec::new();
    if let Some(dir) = dir {
        if !dir.join("task-curves.json").exists() {
            bail!(
                "--anchor-dir {}: no task-curves.json there (the published TitanSched data)",
                dir.display()
            );
        }
        let lut = load_profiles(&dir.join("profiles/V100"))?;
        let base = Catalog::from_json(
            "task-curves.json",
            &std::fs::read_to_string(dir.join("task-curves.json"))?,
        )?;
        let epochs = job_epochs(dir)?;
        for model in FM1_MODELS {
            let mut catalog = base.clone();
            let w = anchor_workload(dir, model, &epochs, &mut catalog)?;
            let cfg = SimConfig {
                profile_s: 0.0,
                ..Default::default()
            };
            cases.push((format!("FM-1-{model}"), cfg, lut.clone(), catalog, w));
        }
    } else {
        eprintln!(
            "no --anchor-dir (or FMSIM_ANCHOR_DIR): benchmarking the generated workload only"
        );
    }
    let catalog = Catalog::default_synthetic();
    let lut = analytic::default_lut()?;
    let generated = GenConfig {
        jobs,
        hours: 8.0,
        load: 2.0,
        seed: 7,
        models: vec!["vit-base".into()],
        ..Default::default()
    };
    let w = generate(&generated, &catalog, &lut).map_err(anyhow::Error::msg)?;
    let cfg = SimConfig::uniform(60, 4, "V100");
    cases.push((
        format!("generated-60x4-{jobs}jobs-2x"),
        cfg,
        lut,
        catalog,
        w,
    ));
    println!(
        "{:<30} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "workload",
        "rounds",
        "mean_ms",
        "p99_ms",
        "max_ms",
        "vars_avg",
        "vars_max",
        "cons_max",
        "fallback"
    );
    let mut summary = Vec::new();
    for (name, cfg, lut, catalog, w) in &cases {
        let r = simulate(cfg, lut, catalog, w, ymir.as_ref())?;
        let s = report::summarize(&r);
        let vars: Vec<usize> = r.model_sizes.iter().map(|m| m.0).collect();
        let vars_avg = if vars.is_empty() {
            0.0
        } else {
            vars.iter().sum::<usize>() as f64 / vars.len() as f64
        };
        println!(
            "{:<30} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.0} {:>9} {:>9} {:>9}",
            name,
            s.rounds,
            s.round_mean_ms,
            s.round_p99_ms,
            s.round_max_ms,
            vars_avg,
            vars.iter().max().unwrap_or(&0),
            r.model_sizes.iter().map(|m| m.1).max().unwrap_or(0),
            s.fallbacks
        );
        summary.push(format!(
            "{name} mean {:.1} ms max {:.1} ms",
            s.round_mean_ms, s.round_max_ms
        ));
    }
    println!("summary: {}", summary.join("; "));
    bench_partitions(5000, 250);
    bench_partitions(5000, 1000);
    Ok(())
}

/// Ymir's solve alone (`Policy::allocate`, no snapshot building or
/// placement) on a generated round of `jobs` queued and running jobs of 4
/// models, 4 merge candidates per job, on `nodes` × 8 GPUs: one solve and
/// parts of at most `partition_units` (the default), 10 rounds each as the
/// running jobs progress.
fn bench_partitions(jobs: usize, nodes: usize) {
    use fmsched_core::policy::ymir::{Ymir, YmirConfig};
    use fmsched_core::policy::{
        MergeMode, NodeCap, PairCandidate, SchedJob, Snapshot, ymir_allocations,
    };
    let mut rng = fmsched_sim::generate::Rng::new(17);
    let gpus = nodes as u32 * 8;
    let allocations = ymir_allocations(gpus);
    let times = |work: f64, max: u32| -> Vec<f64> {
        allocations
            .iter()
            .map(|&a| {
                if a == 0 || a > max {
                    f64::INFINITY
                } else {
                    // Sub-linear: 5 % lost per doubling.
                    work / f64::from(a) * 1.05f64.powf(f64::from(a).log2())
                }
            })
            .collect()
    };
    let mut held = 0u32;
    let mut snap = Snapshot {
        now: 0.0,
        nodes: (0..nodes)
            .map(|n| NodeCap {
                id: format!("n{n}"),
                gpus: 8,
                gpu_model: "A100".into(),
                loaned: false,
                gpu_memory_gib: 80.0,
            })
            .collect(),
        allocations: allocations.clone(),
        jobs: (0..jobs)
            .map(|i| {
                let requested = [1u32, 1, 2, 4, 8][rng.below(5)];
                let max_gpus = (requested * 2).min(16);
                let running = held + requested <= gpus * 3 / 4 && rng.f64() < 0.4;
                if running {
                    held += requested;
                }
                SchedJob {
                    id: format!("j{i}"),
                    model: format!("model-{}", i % 4),
                    task: format!("task-{}", rng.below(12)),
                    sharing: true,
                    requested_gpus: requested,
                    min_gpus: 1,
                    max_gpus,
                    current_gpus: if running { requested } else { 0 },
                    remaining_s: times(3600.0 * (0.5 + 30.0 * rng.f64()), max_gpus),
                    restart_s: 30.0,
                    ..Default::default()
                }
            })
            .collect(),
        candidates: Vec::new(),
        merges: Vec::new(),
        placement_rule: Default::default(),
        queue_gpus: Vec::new(),
    };
    for a in 0..jobs {
        if snap.jobs[a].current_gpus > 0 {
            continue;
        }
        for _ in 0..2 {
            let b = (a + 4 * (1 + rng.below(jobs / 4 - 1))) % jobs;
            if snap.jobs[b].current_gpus > 0 || snap.jobs[b].task == snap.jobs[a].task {
                continue;
            }
            let w = 0.8 + 0.8 * rng.f64();
            let work = 3600.0 * (0.5 + 40.0 * rng.f64());
            snap.candidates.push(PairCandidate {
                a,
                b,
                mode: MergeMode::Temporal,
                remaining_s: times(work, 16),
                tran_wt: allocations
                    .iter()
                    .map(|&x| if x == 0 { 0.0 } else { w })
                    .collect(),
            });
        }
    }
    let d = YmirConfig::default();
    for (name, parts, milp) in [
        ("one MILP".to_string(), 0usize, 0usize),
        ("MILP parts of <= 1000 units".to_string(), 1000, 0),
        ("MILP parts of <= 250 units".to_string(), 250, 0),
        ("LP-relaxation greedy, one solve".to_string(), 0, 1),
        (
            format!(
                "default (parts of <= {} units (0 = none), relaxation over {} units)",
                d.partition_units, d.milp_units
            ),
            d.partition_units,
            d.milp_units,
        ),
    ] {
        let ymir = Ymir::new(YmirConfig {
            partition_units: parts,
            milp_units: milp,
            ..Default::default()
        });
        let mut ms = Vec::new();
        let (mut objective, mut fallbacks, mut partitions, mut relaxed) = (0.0, 0, 0, 0);
        let mut round = snap.clone();
        for r in 0..10 {
            // The running jobs progress between rounds.
            for j in round.jobs.iter_mut().filter(|j| j.current_gpus > 0) {
                for t in j.remaining_s.iter_mut() {
                    *t *= 0.97;
                }
            }
            round.now = 120.0 * r as f64;
            let t = Instant::now();
            let plan = fmsched_core::policy::Policy::allocate(&ymir, &round);
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            objective += plan.stats.objective;
            fallbacks += usize::from(plan.stats.fallback);
            partitions = plan.stats.partitions;
            relaxed += usize::from(plan.stats.relaxed);
        }
        ms.sort_by(f64::total_cmp);
        println!(
            "ymir solve, {jobs} jobs of 4 models ({} candidate pairs), {nodes} x 8 GPUs, {name}: mean {:.1} ms, p99 {:.1} ms over {} rounds ({partitions} parts, {fallbacks} fallbacks, {relaxed} relaxed, objective {:.1})",
            snap.candidates.len(),
            ms.iter().sum::<f64>() / ms.len() as f64,
            report::percentile(&ms, 99.0),
            ms.len(),
            objective / ms.len() as f64,
        );
    }
}
