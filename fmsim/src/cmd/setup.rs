//! What every simulating command shares: the policy, knobs, profiles,
//! catalog and cluster named on the command line, the workload read and
//! checked, one simulation run, and its outputs written.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use fmsched_core::policy::Policy;
use fmsched_core::policy::lyra::ReclaimRule;
use fmsched_core::policy::{POLICY_NAMES, by_name};
use fmsched_estimator::analytic;
use fmsched_estimator::lut::Lut;
use fmsched_sim::catalog::Catalog;
use fmsched_sim::engine::{NodeGroup, SimConfig, SimResult, Simulation};
use fmsched_sim::loans::{InferenceTrace, Loans};
use fmsched_sim::workload::WorkloadJob;
use fmsched_sim::{report, workload};

use crate::cmd::args::{EstimateSource, SimArgs};
use crate::cmd::job_file::{PerJob, apply_job_file, job_file};

pub(crate) fn policy(name: &str) -> anyhow::Result<Box<dyn Policy + Send + Sync>> {
    by_name(name.trim()).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown policy {name:?}; expected one of {}",
            POLICY_NAMES.join(", ")
        )
    })
}

/// Parses `--knob NAME=VALUE` flags.
pub(crate) fn parse_knobs(raw: &[String]) -> anyhow::Result<BTreeMap<String, f64>> {
    raw.iter()
        .map(|k| {
            let (n, v) = k
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--knob {k:?}: expected NAME=VALUE"))?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("--knob {k:?}: {v:?} is not a number"))?;
            Ok((n.trim().to_string(), v))
        })
        .collect()
}

/// Loads a folder of profiles into a LUT.
pub(crate) fn load_profiles(dir: &Path) -> anyhow::Result<Lut> {
    let mut lut = Lut::default();
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "csv") {
                files.push(p);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        bail!("{}: no profile CSVs", dir.display());
    }
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let gpu = f
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let layout = [
            "placements",
            "scalability",
            "memory",
            "context_switch",
            "sharing",
        ]
        .into_iter()
        .find(|l| stem.ends_with(&format!("_{l}")));
        match layout {
            Some("sharing") => {}
            Some(l) => {
                let model = &stem[..stem.len() - l.len() - 1];
                lut.import_csv(
                    model,
                    &analytic::gpu_family(gpu),
                    l,
                    &f.display().to_string(),
                    &text,
                )?;
            }
            _ => {
                lut.import_csv("", "", "fmsched", &f.display().to_string(), &text)?;
            }
        }
    }
    for g in &analytic::GPUS {
        lut.gpu_memory.insert(g.name.to_string(), g.memory_gib);
    }
    Ok(lut)
}

pub(crate) fn load_catalog(path: Option<&Path>, samples: &[String]) -> anyhow::Result<Catalog> {
    let shipped = Catalog::default_synthetic();
    let mut c = match path {
        None => shipped,
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let mut c = Catalog::from_json(&p.display().to_string(), &text)?;
            c.fill_samples_from(&shipped);
            c
        }
    };
    for (key, n) in samples_per_epoch(samples)? {
        // `MODEL/TASK` when the part before the first '/' is a model of the
        // catalog; task names may hold '/' themselves (frgfm/imagenette).
        let (model, task) = match key.split_once('/') {
            Some((m, t)) if c.models.contains_key(m) => (Some(m.to_string()), t.to_string()),
            _ => (None, key.clone()),
        };
        let set = c.set_samples_per_epoch(model.as_deref(), &task, n);
        if set == 0 {
            bail!(
                "--samples-per-epoch {task}={n}: no task {task:?}{} in the catalog",
                model
                    .map(|m| format!(" of model {m:?}"))
                    .unwrap_or_default()
            );
        }
    }
    Ok(c)
}

/// `--samples-per-epoch` values: `TASK=N`, `MODEL/TASK=N`, or a file of
/// such lines (`#` comments; `,` works as `=`).
pub(crate) fn samples_per_epoch(args: &[String]) -> anyhow::Result<Vec<(String, f64)>> {
    let mut out = Vec::new();
    let mut one = |what: &str, item: &str| -> anyhow::Result<()> {
        let (key, n) = item
            .split_once(['=', ','])
            .with_context(|| format!("{what}: {item:?} is not TASK=N"))?;
        let n: f64 = n
            .trim()
            .parse()
            .ok()
            .filter(|n: &f64| n.is_finite() && *n > 0.0)
            .with_context(|| format!("{what}: {:?} is not a number > 0", n.trim()))?;
        out.push((key.trim().to_string(), n));
        Ok(())
    };
    for a in args {
        if a.contains('=') {
            one("--samples-per-epoch", a)?;
            continue;
        }
        let text = std::fs::read_to_string(a).with_context(|| format!("reading {a}"))?;
        if text
            .lines()
            .next()
            .is_some_and(|h| h.split(',').any(|c| c.trim() == "progress_per_epoch"))
        {
            // A per-job file (the TitanSched `job-epochs-FM-1.csv` layout):
            // `application` is `<model>@<task>`, with `#` for the `/` of a
            // hub dataset's name, as in their workloads.
            let csv = workload::Csv::parse(a, &text)?;
            let col = |n: &str| {
                csv.col(n)
                    .with_context(|| format!("{a}: missing column {n}"))
            };
            let (app, ppe) = (col("application")?, col("progress_per_epoch")?);
            for (line, r) in &csv.rows {
                let key = r[app].trim().replacen('@', "/", 1).replace('#', "/");
                one(&format!("{a} line {line}"), &format!("{key}={}", r[ppe]))?;
            }
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if !line.is_empty() && !line.starts_with('#') {
                one(&format!("{a} line {}", i + 1), line)?;
            }
        }
    }
    Ok(out)
}

/// Prints "done/total" on stderr for runs longer than a second.
fn progress_bar(label: String) -> impl FnMut(usize, usize) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last = Instant::now();
    move |done, total| {
        if tty
            && started.elapsed().as_secs_f64() > 1.0
            && (last.elapsed().as_millis() > 200 || done == total)
        {
            last = Instant::now();
            let width = 30;
            let filled = width * done / total.max(1);
            eprint!(
                "\r{label:<14} [{}{}] {done}/{total} jobs",
                "#".repeat(filled),
                ".".repeat(width - filled)
            );
            if done == total {
                eprintln!();
            }
            let _ = std::io::stderr().flush();
        }
    }
}

pub(crate) fn simulate(
    cfg: &SimConfig,
    lut: &Lut,
    catalog: &Catalog,
    jobs: &[WorkloadJob],
    p: &dyn Policy,
) -> anyhow::Result<SimResult> {
    let sim = Simulation::new(cfg.clone(), lut, catalog, jobs)?;
    Ok(sim.run(p, catalog, progress_bar(p.name().to_string()))?)
}

pub(crate) fn write_outputs(
    out: &Path,
    results: &[SimResult],
    rows: &[report::Summary],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for r in results {
        std::fs::write(
            out.join(format!("jobs-{}.csv", r.policy)),
            report::jobs_csv(r),
        )?;
    }
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&report::to_json(rows))?,
    )?;
    std::fs::write(out.join("summary.txt"), report::table(rows))?;
    std::fs::write(out.join("jct-cdf.svg"), report::svg_cdf(results))?;
    eprintln!(
        "wrote job CSVs, summary.json, summary.txt and jct-cdf.svg to {}",
        out.display()
    );
    Ok(())
}

/// A `--queues` file: `[[queues]]` tables, validated as the service
/// validates `[[scheduling.queues]]`.
fn read_queues(path: &std::path::Path) -> anyhow::Result<fmsched_core::queue::Queues> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(default)]
        queues: Vec<fmsched_core::queue::QueueSpec>,
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--queues {}: {e}", path.display()))?;
    let f: File =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("--queues {}: {e}", path.display()))?;
    fmsched_core::queue::Queues::new(f.queues)
        .map_err(|e| anyhow::anyhow!("--queues {}: {e}", path.display()))
}

/// The node groups `--nodes` or `--cluster` describe.
pub(crate) fn node_group(
    ty: &str,
    count: &str,
    gpus: &str,
    what: &str,
) -> anyhow::Result<NodeGroup> {
    let num = |v: &str, field: &str| -> anyhow::Result<u32> {
        v.trim()
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| anyhow::anyhow!("{what}: {field} {v:?} is not a whole number > 0"))
    };
    if ty.trim().is_empty() {
        bail!("{what}: the GPU type is empty");
    }
    let g = num(gpus, "GPUs per node")?;
    if g > 9 {
        bail!("{what}: {g} GPUs per node; fmsim models nodes of 1-9 GPUs");
    }
    Ok(NodeGroup::new(ty.trim(), num(count, "node count")?, g))
}

/// The inference side `--inference-nodes` and its flags describe (None
/// without inference nodes).
fn loans_of(a: &SimArgs) -> anyhow::Result<Option<Loans>> {
    if a.inference_nodes.is_empty() {
        if a.inference_trace.is_some() {
            bail!("--inference-trace needs --inference-nodes");
        }
        return Ok(None);
    }
    let inference = a
        .inference_nodes
        .iter()
        .map(|n| match n.split(':').collect::<Vec<_>>()[..] {
            [ty, count, gpus] => node_group(ty, count, gpus, &format!("--inference-nodes {n}")),
            _ => bail!("--inference-nodes {n:?}: expected TYPE:COUNT:GPUS (e.g. V100:8:8)"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let trace = match &a.inference_trace {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            InferenceTrace::from_csv(&text)
                .map_err(|e| anyhow::anyhow!("--inference-trace {}: {e}", p.display()))?
        }
        None => {
            let (mean, ratio) = a
                .inference_diurnal
                .split_once(':')
                .and_then(|(m, r)| Some((m.trim().parse::<f64>().ok()?, r.trim().parse::<f64>().ok()?)))
                .filter(|&(m, r)| (0.0..=1.0).contains(&m) && r >= 1.0)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--inference-diurnal {:?}: expected MEAN:PEAK_TO_TROUGH with MEAN in [0, 1] and the ratio >= 1 (e.g. 0.65:2.2)",
                        a.inference_diurnal
                    )
                })?;
            InferenceTrace::diurnal(mean, ratio, 300.0)
        }
    };
    if !(0.0..1.0).contains(&a.loan_headroom) {
        bail!("--loan-headroom {}: must be in [0, 1)", a.loan_headroom);
    }
    if !(a.loan_every_s >= 1.0 && a.loan_every_s.is_finite()) {
        bail!("--loan-every-s {}: must be at least 1", a.loan_every_s);
    }
    Ok(Some(Loans {
        inference,
        trace,
        headroom: a.loan_headroom,
        every_s: a.loan_every_s,
        rule: ReclaimRule::parse(&a.reclaim).map_err(|e| anyhow::anyhow!("--reclaim: {e}"))?,
    }))
}

pub(crate) fn cluster_of(a: &SimArgs) -> anyhow::Result<Vec<NodeGroup>> {
    let group = node_group;
    if let Some(path) = &a.cluster {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let csv = workload::Csv::parse(&path.display().to_string(), &text)?;
        let col = |n: &str| {
            csv.col(n).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: missing column {n:?} (expected gpu_type,count,gpus_per_node)",
                    path.display()
                )
            })
        };
        let (ty, count, gpus) = (col("gpu_type")?, col("count")?, col("gpus_per_node")?);
        let groups = csv
            .rows
            .iter()
            .map(|(line, r)| {
                let what = format!("{} line {line}", path.display());
                group(&r[ty], &r[count], &r[gpus], &what)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if groups.is_empty() {
            bail!("{}: no node groups", path.display());
        }
        return Ok(groups);
    }
    match a.nodes.as_slice() {
        [] => group(&a.gpu_type, "8", &a.gpus_per_node.to_string(), "--nodes").map(|g| vec![g]),
        [n] if !n.contains(':') => {
            group(&a.gpu_type, n, &a.gpus_per_node.to_string(), "--nodes").map(|g| vec![g])
        }
        many => many
            .iter()
            .map(|n| match n.split(':').collect::<Vec<_>>()[..] {
                [ty, count, gpus] => group(ty, count, gpus, &format!("--nodes {n}")),
                _ => bail!(
                    "--nodes {n:?}: expected TYPE:COUNT:GPUS (e.g. A100:4:8); a bare count is for a cluster of one GPU type"
                ),
            })
            .collect(),
    }
}

pub(crate) fn sim_setup(
    a: &SimArgs,
) -> anyhow::Result<(SimConfig, Lut, Catalog, Vec<WorkloadJob>)> {
    let lut = match &a.profiles {
        Some(d) => load_profiles(d)?,
        None => analytic::default_lut()?,
    };
    let catalog = load_catalog(a.catalog.as_deref(), &a.samples_per_epoch)?;
    let cluster = cluster_of(a)?;
    let mut jobs = workload::read(&a.workload, a.format, &catalog.trace_tasks(&lut, &cluster))?;
    for (file, what) in [
        (&a.job_epochs, PerJob::Epochs),
        (&a.job_max_gpus, PerJob::MaxGpus),
    ] {
        if let Some(f) = file {
            let table = job_file(f)?;
            apply_job_file(&mut jobs, &table, what, &f.display().to_string())?;
        }
    }
    if let Some(mix) = a.slo_mix {
        workload::assign_slos(&mut jobs, mix, a.slo_seed);
    }
    if jobs.is_empty() {
        bail!("{}: the workload has no jobs", a.workload.display());
    }
    // Every task without samples per epoch at once, not one per run.
    let missing: std::collections::BTreeSet<(&str, &str)> = jobs
        .iter()
        .filter(|j| {
            catalog
                .task(&j.model, &j.task)
                .is_some_and(|t| t.samples_per_epoch <= 0.0)
        })
        .map(|j| (j.model.as_str(), j.task.as_str()))
        .collect();
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().map(|(m, t)| format!("{m}/{t}")).collect();
        let flags: Vec<String> = missing
            .iter()
            .map(|(_, t)| format!("--samples-per-epoch {t}=N"))
            .collect();
        bail!(
            "{} task(s) of the workload have no samples per epoch in the catalog (published curves carry none): {}; give them with {} (or a file of TASK=N lines)",
            missing.len(),
            names.join(", "),
            flags.join(" ")
        );
    }
    let queues = match &a.queues {
        Some(p) => read_queues(p)?,
        None => Default::default(),
    };
    for j in &jobs {
        let q = &j.queueing.queue;
        if queues.is_empty() && !q.is_empty() {
            bail!("job {}: queue {q:?} but no --queues file was given", j.name);
        }
        if !queues.is_empty() {
            queues
                .resolve(q, "fmsim", true, &j.model)
                .map_err(|e| anyhow::anyhow!("job {}: {e}", j.name))?;
        }
    }
    if let Some(share) = a.elastic_share {
        if !(0.0..=1.0).contains(&share) {
            bail!("--elastic-share {share}: must be in [0, 1]");
        }
        workload::make_elastic(&mut jobs, share, a.slo_seed);
    }
    let cfg = SimConfig {
        loans: loans_of(a)?,
        queues,
        cluster,
        checkpoint_s: a.checkpoint_s,
        context_switch_s: a.context_switch_s,
        profile_s: a.profile_s,
        estimate_noise: a.estimate_noise,
        gain_noise: a.gain_noise,
        learned_estimates: a.estimates == EstimateSource::Learned,
        placement_rule: a.placement,
        round_origin_s: a.round_origin,
        event_gap_s: a.event_gap,
        deadline_gap_s: (a.deadline_gap > 0.0).then_some(a.deadline_gap),
        layers: a.layers,
        gpu_sharing: a.gpu_sharing,
        ..Default::default()
    };
    if !(0.0..1.0).contains(&cfg.estimate_noise) {
        bail!("--estimate-noise must be in [0, 1)");
    }
    if !(0.0..1.0).contains(&cfg.gain_noise) {
        bail!("--gain-noise {}: must be in [0, 1)", cfg.gain_noise);
    }
    if !(a.deadline_gap.is_finite() && a.deadline_gap >= 0.0) {
        bail!(
            "--deadline-gap {}: must be a number of seconds, 0 or above",
            a.deadline_gap
        );
    }
    if let Some(g) = cfg.event_gap_s {
        if !(g.is_finite() && g > 0.0) {
            bail!("--event-gap {g}: must be a number of seconds above 0");
        }
        if cfg.round_origin_s.is_some() {
            bail!(
                "--event-gap with --round-origin: rounds on events leave the fixed grid of rounds"
            );
        }
    }
    if cfg.learned_estimates {
        if cfg.estimate_noise > 0.0 {
            bail!(
                "--estimates learned replays the estimator's own errors; give --estimate-noise only with --estimates exact"
            );
        }
        check_learnable(&catalog, &jobs)?;
    }
    Ok((cfg, lut, catalog, jobs))
}

/// `--estimates learned` acts only on jobs with a metric target whose
/// catalog entry is a per-epoch curve: refused when no job has both.
pub(crate) fn check_learnable(catalog: &Catalog, jobs: &[WorkloadJob]) -> anyhow::Result<()> {
    let learnable = jobs.iter().any(|j| {
        j.epochs.is_none()
            && j.target_metric.is_some()
            && catalog.task(&j.model, &j.task).is_some_and(|t| {
                t.alone
                    .values()
                    .any(|w| matches!(w, fmsched_sim::catalog::Work::Curve(_)))
            })
    });
    if !learnable {
        bail!(
            "--estimates learned: no job of the workload has a target_metric and a per-epoch metric curve in the \
             catalog (the learned estimator predicts epochs-to-target from metric curves, e.g. a catalog in the \
             published task-curves.json layout)"
        );
    }
    Ok(())
}

/// `a / b` as "N.NNx lower", or what it is when `b` is 0.
pub(crate) fn times_lower(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x lower", a / b)
    } else if a > 0.0 {
        format!("{:.1}% against none", 100.0 * a)
    } else {
        "none on either".to_string()
    }
}

/// Comma-separated numbers of a sweep flag.
pub(crate) fn numbers(flag: &str, raw: &str) -> anyhow::Result<Vec<f64>> {
    raw.split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| anyhow::anyhow!("{flag}: {v:?} is not a number"))
        })
        .collect()
}
