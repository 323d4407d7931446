//! Workloads: the jobs a simulation replays, and the readers of every trace
//! format `fmsim` accepts. Every reader names the file and line of a
//! malformed row.
//!
//! Formats (`--format`, or guessed from the header):
//! - **fmsim** (the project's own, written by `fmsim generate`):
//!   `name,submit_s,model,task,gpus,batch,sharing,pipeline[,epochs][,gpu_model][,expert_parallel][,slo,deadline_s,deadline_x][,min_gpus]` —
//!   `epochs` overrides the catalog's epochs-to-target for that job;
//!   `gpu_model` pins it to one GPU model (empty: any, one per job);
//!   `expert_parallel` runs an MoE job in expert groups of that many GPUs,
//!   each on one node (empty or 0: none); `slo` (`best_effort`, `slo`,
//!   `soft_slo`; empty: `slo` when a deadline is given) with `deadline_s`
//!   (seconds after submission) or `deadline_x` (a multiple of the job's
//!   time alone at its requested GPUs) make it an SLO job (UniSched);
//!   optional `queue`, `priority` and `preemptible` (empty: none, 0, 1)
//!   put it in a queue of `--queues` (docs/queues.md); `min_gpus` is the
//!   fewest GPUs it may run on, as a spec's `resources.min_gpus` (empty or
//!   0: one; at most `gpus`; `--base-demands` makes it `gpus` for all);
//!   `max_work_x` (empty: none) makes it stop on a metric target, its
//!   user's maximum iterations that multiple (≥ 1) of its work.
//! - **titan** (TitanSched workload CSV):
//!   `name,submission_time,application,num_gpus,target_batch_size,target_lr,target_gradient_steps,target_metric`
//!   with `application = model@task` (`/` written `#`).
//! - **pollux** (`adaptdl`; the Pollux/AdaptDL simulator's workload CSV):
//!   `name,time,application,num_replicas,batch_size` — `time` is the
//!   arrival in seconds, `num_replicas` the GPUs, `batch_size` the global
//!   batch. Its applications (cifar10, bert, …) are not fine-tuning tasks:
//!   each application is given one task of the catalog (deterministically,
//!   by its name, so its jobs share it), trained to the catalog's epochs.
//! - **helios** (Helios `cluster_log.csv`): `job_id,…,gpu_num,…,submit_time,…,duration,…`;
//!   jobs with `gpu_num > 0` keep their arrival times (seconds from the
//!   first), GPU count and GPU-time; each is given a fine-tuning task from
//!   the catalog (deterministically, by job id), with epochs scaled so its
//!   work at its GPU count matches the trace's duration.
//! - **philly**: the published Philly job log (`cluster_job_log`, a JSON
//!   array of jobs: `jobid`, `status`, `submitted_time`, `attempts` with
//!   `start_time`, `end_time` and `detail[].gpus`), or that log flattened to
//!   CSV (`jobid,submitted_time,num_gpus,duration_s`; more columns are
//!   ignored); mapped like Helios. From the JSON: the GPUs of the last
//!   attempt, the run time summed over attempts that ended; jobs that never
//!   ran or were killed are left out.

use std::collections::BTreeMap;
use std::path::Path;

use fmsched_core::SloClass;

/// One job of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadJob {
    pub name: String,
    /// Seconds from the start of the trace.
    pub submit_s: f64,
    pub model: String,
    pub task: String,
    /// GPUs requested (also the job's maximum unless `max_gpus` is set).
    pub gpus: u32,
    pub max_gpus: u32,
    /// The fewest GPUs it may run on (`resources.min_gpus`; 0 = one).
    pub min_gpus: u32,
    pub batch: u32,
    pub sharing: bool,
    pub pipeline: bool,
    /// Epochs to target alone, overriding the catalog (None = catalog).
    pub epochs: Option<f64>,
    /// Evaluation metric target (titan workloads), to derive epochs from
    /// the catalog's curves.
    pub target_metric: Option<f64>,
    /// "lr=…,grad_accum=…" key of the catalog curve (titan workloads).
    pub curve_key: Option<String>,
    /// Trace GPU-seconds to match (helios / philly).
    pub trace_gpu_s: Option<f64>,
    /// The GPU model it must run on (`resources.gpu_model`); None = any,
    /// one model per job.
    pub gpu_model: Option<String>,
    /// Expert-parallel group size of an MoE model (0 = none): whole groups,
    /// each on one node.
    pub expert_parallel: u32,
    /// Its service class and deadline (UniSched).
    pub slo: SloSpec,
    /// Its queue, priority and preemption class.
    pub queueing: Queueing,
    /// A job that stops on a metric target (UniSched's performance-based
    /// stopping criterion, §5.4.2): its work above is what it needs to
    /// reach the target, and its user's maximum iterations are this
    /// multiple of that work (≥ 1). A policy without an iteration estimator
    /// (Chronus as published) plans it at that maximum. None: it stops on
    /// its iteration budget, which is its work.
    pub max_work_x: Option<f64>,
}

/// A job's queue (empty: none), priority within it and preemption class
/// ([`fmsched_core::queue`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Queueing {
    pub queue: String,
    pub priority: i32,
    pub preemptible: bool,
}

impl Default for Queueing {
    fn default() -> Self {
        Self {
            queue: String::new(),
            priority: 0,
            preemptible: true,
        }
    }
}

/// A job's service class and deadline. The deadline is either seconds
/// after submission or a multiple of the job's time alone at its requested
/// GPUs (how the thesis generates deadlines, §5.4.2); the class defaults
/// by the one rule of every entry point: SLO when a deadline is given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SloSpec {
    pub class: Option<SloClass>,
    /// Seconds after submission.
    pub deadline_s: Option<f64>,
    /// Multiple of the job's time alone at its requested GPUs.
    pub deadline_x: Option<f64>,
}

impl SloSpec {
    /// The class, by the service's one rule ([`SloClass::or_default_for`]).
    pub fn class(&self) -> SloClass {
        SloClass::or_default_for(
            self.class,
            self.deadline_s.is_some() || self.deadline_x.is_some(),
        )
    }

    /// The deadline, seconds after submission, for a job `alone_s` long.
    pub fn deadline_after(&self, alone_s: f64) -> Option<f64> {
        self.deadline_s.or(self.deadline_x.map(|x| x * alone_s))
    }
}

/// The workloads of the thesis' SLO evaluation (§5.4.2): all strict SLO
/// jobs, strict SLO mixed with best-effort (MIX1), and strict, soft and
/// best-effort (MIX2). The thesis does not give the shares of each class;
/// fmsim uses half SLO in MIX1, and 30 % strict / 30 % soft in MIX2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SloMix {
    Slo,
    Mix1,
    Mix2,
}

impl std::str::FromStr for SloMix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "slo" => Ok(SloMix::Slo),
            "mix1" => Ok(SloMix::Mix1),
            "mix2" => Ok(SloMix::Mix2),
            o => Err(format!("unknown SLO mix {o:?}; expected slo, mix1 or mix2")),
        }
    }
}

/// Gives every job a class by `mix` and, to SLO jobs, a deadline of
/// U[1.1, 2] × its time alone (§5.4.2: "we randomly generate a deadline
/// within a range of 1.1 to 2 times the job duration"; a soft job's later
/// steps follow from it). Seeded: the same arguments give the same classes.
///
/// Stopping criteria as the thesis' workloads have them (§5.4.2: "80 %
/// iteration-based, 20 % performance-based"): a fifth of the jobs, of every
/// class, stop on a metric target ([`WorkloadJob::max_work_x`]). Their work
/// stays what the trace gives (the thesis scales their speed so that their
/// duration matches it); their user's maximum iterations are more: a target
/// of the best metric saves up to 22 % of the default iterations and one of
/// 99 % of it up to 31 % (§5.2.1, Fig. 5.1), each chosen for half of them
/// ("we randomly choose the best metric or 99 % best metric"), the saving
/// U[0, that most]. The thesis gives only those maxima; the uniform draw is
/// fmsim's. A draw of its own: the classes and deadlines are those of the
/// same seed without it.
pub fn assign_slos(jobs: &mut [WorkloadJob], mix: SloMix, seed: u64) {
    let mut stops = crate::rng::Rng::new(seed ^ 0x57_0b);
    for j in jobs.iter_mut() {
        let (performance, best, u) = (stops.f64() < 0.2, stops.f64() < 0.5, stops.f64());
        j.max_work_x = performance.then(|| {
            let saving = u * if best { 0.22 } else { 0.31 };
            (1000.0 / (1.0 - saving)).round() / 1000.0
        });
    }
    let mut rng = crate::rng::Rng::new(seed ^ 0x5107);
    for j in jobs {
        let u = rng.f64();
        let class = match mix {
            SloMix::Slo => SloClass::Slo,
            SloMix::Mix1 if u < 0.5 => SloClass::Slo,
            SloMix::Mix2 if u < 0.3 => SloClass::Slo,
            SloMix::Mix2 if u < 0.6 => SloClass::SoftSlo,
            _ => SloClass::BestEffort,
        };
        let x = 1.1 + 0.9 * rng.f64();
        j.slo = SloSpec {
            class: Some(class),
            deadline_s: None,
            deadline_x: class
                .has_deadline()
                .then_some((x * 1000.0).round() / 1000.0),
        };
    }
}

/// Makes about `share` of the jobs elastic (Lyra): each chosen job may
/// grow to twice its request (the thesis' "Ideal" scenario: "its scaling
/// range is twice that", §3.7.1); its request stays its base demand.
/// Seeded: the same arguments choose the same jobs.
pub fn make_elastic(jobs: &mut [WorkloadJob], share: f64, seed: u64) {
    let mut rng = crate::rng::Rng::new(seed ^ 0xE1A5);
    for j in jobs {
        if rng.f64() < share {
            j.max_gpus = j.max_gpus.max(2 * j.gpus);
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WorkloadError {
    #[error("{file} line {line}: {message}")]
    Row {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}: {message}")]
    File { file: String, message: String },
}

/// A parsed CSV: header names and rows with their line numbers.
pub struct Csv {
    pub file: String,
    pub header: Vec<String>,
    pub rows: Vec<(usize, Vec<String>)>,
}

impl Csv {
    pub fn parse(file: &str, text: &str) -> Result<Csv, WorkloadError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
            .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
        let (_, header) = lines.next().ok_or_else(|| WorkloadError::File {
            file: file.into(),
            message: "empty file (a header row is required)".into(),
        })?;
        let header: Vec<String> = split_csv(header)
            .into_iter()
            .map(|h| h.trim().to_string())
            .collect();
        let mut rows = Vec::new();
        for (line, l) in lines {
            let cells = split_csv(l);
            if cells.len() < header.len() {
                return Err(WorkloadError::Row {
                    file: file.into(),
                    line,
                    message: format!("{} fields, the header has {}", cells.len(), header.len()),
                });
            }
            rows.push((line, cells));
        }
        Ok(Csv {
            file: file.into(),
            header,
            rows,
        })
    }

    pub fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    fn need(&self, name: &str) -> Result<usize, WorkloadError> {
        self.col(name).ok_or_else(|| WorkloadError::File {
            file: self.file.clone(),
            message: format!("missing column {name:?}"),
        })
    }

    fn err(&self, line: usize, message: impl Into<String>) -> WorkloadError {
        WorkloadError::Row {
            file: self.file.clone(),
            line,
            message: message.into(),
        }
    }

    fn num(&self, line: usize, row: &[String], col: usize) -> Result<f64, WorkloadError> {
        let raw = row[col].trim();
        let v: f64 = raw.parse().map_err(|_| {
            self.err(
                line,
                format!("{}: {raw:?} is not a number", self.header[col]),
            )
        })?;
        if !v.is_finite() || v < 0.0 {
            return Err(self.err(
                line,
                format!("{}: {raw:?} must be a finite number >= 0", self.header[col]),
            ));
        }
        Ok(v)
    }

    fn whole(&self, line: usize, row: &[String], col: usize) -> Result<u32, WorkloadError> {
        let v = self.num(line, row, col)?;
        if v.fract() != 0.0 || v > f64::from(u32::MAX) {
            return Err(self.err(
                line,
                format!("{}: {v} is not a whole number", self.header[col]),
            ));
        }
        Ok(v as u32)
    }

    fn flag(&self, line: usize, row: &[String], col: usize) -> Result<bool, WorkloadError> {
        match row[col].trim() {
            "1" | "true" | "yes" => Ok(true),
            "0" | "false" | "no" | "" => Ok(false),
            o => Err(self.err(
                line,
                format!("{}: {o:?} is not a boolean", self.header[col]),
            )),
        }
    }
}

/// Splits one CSV line, honouring double quotes (Helios job names have commas).
fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Which reader to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Fmsim,
    Titan,
    Helios,
    Philly,
    Pollux,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fmsim" => Ok(Format::Fmsim),
            "titan" => Ok(Format::Titan),
            "pollux" | "adaptdl" => Ok(Format::Pollux),
            "helios" => Ok(Format::Helios),
            "philly" => Ok(Format::Philly),
            o => Err(format!(
                "unknown workload format {o:?}; expected fmsim, titan, pollux, helios or philly"
            )),
        }
    }
}

/// Guesses the format from the header.
pub fn detect(csv: &Csv) -> Option<Format> {
    let has = |c: &str| csv.col(c).is_some();
    if has("submit_s") && has("task") {
        Some(Format::Fmsim)
    } else if has("application") && has("submission_time") {
        Some(Format::Titan)
    } else if has("application") && has("num_replicas") && has("time") {
        Some(Format::Pollux)
    } else if has("gpu_num") && has("submit_time") && has("duration") {
        Some(Format::Helios)
    } else if has("submitted_time") && has("num_gpus") {
        Some(Format::Philly)
    } else {
        None
    }
}

/// Reads a workload file.
pub fn read(
    path: &Path,
    format: Option<Format>,
    tasks: &[(String, String)],
) -> Result<Vec<WorkloadJob>, WorkloadError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| WorkloadError::File {
        file: file.clone(),
        message: e.to_string(),
    })?;
    parse(&file, &text, format, tasks)
}

/// Parses a workload; `tasks` are the (model, task) pairs trace formats
/// without tasks (helios, philly) draw from.
pub fn parse(
    file: &str,
    text: &str,
    format: Option<Format>,
    tasks: &[(String, String)],
) -> Result<Vec<WorkloadJob>, WorkloadError> {
    if text.trim_start().starts_with(['[', '{']) {
        if !matches!(format, None | Some(Format::Philly)) {
            return Err(WorkloadError::File {
                file: file.into(),
                message: "a JSON workload is read as the Philly job log (--format philly)".into(),
            });
        }
        let mut jobs = trace_jobs(philly_json(file, text)?, tasks, file)?;
        return finish(file, &mut jobs).map(|()| jobs);
    }
    let csv = Csv::parse(file, text)?;
    let format = format
        .or_else(|| detect(&csv))
        .ok_or_else(|| WorkloadError::File {
            file: file.into(),
            message: "cannot tell the workload format from the header; pass --format".into(),
        })?;
    let mut jobs = match format {
        Format::Fmsim => parse_fmsim(&csv)?,
        Format::Titan => parse_titan(&csv)?,
        Format::Helios => parse_trace(
            &csv,
            tasks,
            "job_id",
            "gpu_num",
            "submit_time",
            "duration",
            Some("state"),
        )?,
        Format::Philly => parse_trace(
            &csv,
            tasks,
            "jobid",
            "num_gpus",
            "submitted_time",
            "duration_s",
            None,
        )?,
        Format::Pollux => parse_pollux(&csv, tasks)?,
    };
    finish(file, &mut jobs)?;
    Ok(jobs)
}

/// Orders jobs by arrival and refuses a name used twice.
fn finish(file: &str, jobs: &mut [WorkloadJob]) -> Result<(), WorkloadError> {
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s).then(a.name.cmp(&b.name)));
    let mut seen = BTreeMap::new();
    for j in jobs.iter() {
        if seen.insert(j.name.clone(), ()).is_some() {
            return Err(WorkloadError::File {
                file: file.into(),
                message: format!("job name {:?} appears twice", j.name),
            });
        }
    }
    Ok(())
}

/// The catalog task a trace job named `name` fine-tunes: picked by an
/// FNV-1a hash of the name, the same on every run (`tasks` not empty).
fn task_of<'a>(name: &str, tasks: &'a [(String, String)]) -> &'a (String, String) {
    &tasks[(fmsched_core::hash::fnv1a(name.as_bytes()) % tasks.len() as u64) as usize]
}

/// The Pollux/AdaptDL simulator's workload CSV (see the module docs).
fn parse_pollux(csv: &Csv, tasks: &[(String, String)]) -> Result<Vec<WorkloadJob>, WorkloadError> {
    if tasks.is_empty() {
        return Err(WorkloadError::File {
            file: csv.file.clone(),
            message: "the task catalog has no tasks to assign".into(),
        });
    }
    let (name, time, app, replicas, batch) = (
        csv.need("name")?,
        csv.need("time")?,
        csv.need("application")?,
        csv.need("num_replicas")?,
        csv.need("batch_size")?,
    );
    let mut out = Vec::new();
    for (line, r) in &csv.rows {
        let (g, b) = (csv.whole(*line, r, replicas)?, csv.whole(*line, r, batch)?);
        if g == 0 || b == 0 {
            return Err(csv.err(*line, "num_replicas and batch_size must be > 0"));
        }
        for (col, what) in [(name, "name"), (app, "application")] {
            if r[col].trim().is_empty() {
                return Err(csv.err(*line, format!("{what} is empty")));
            }
        }
        let (model, task) = task_of(r[app].trim(), tasks);
        out.push(WorkloadJob {
            name: r[name].trim().into(),
            submit_s: csv.num(*line, r, time)?,
            model: model.clone(),
            task: task.clone(),
            gpus: g.min(64),
            max_gpus: g.min(64),
            min_gpus: 0,
            batch: b,
            sharing: true,
            pipeline: false,
            epochs: None,
            target_metric: None,
            curve_key: None,
            trace_gpu_s: None,
            gpu_model: None,
            expert_parallel: 0,
            slo: SloSpec::default(),
            queueing: Queueing::default(),
            max_work_x: None,
        });
    }
    Ok(out)
}

/// The published Philly job log (JSON): (job id, submitted at, GPUs, run
/// seconds) of every job that ran and was not killed.
fn philly_json(file: &str, text: &str) -> Result<Vec<(String, f64, u32, f64)>, WorkloadError> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| WorkloadError::Row {
        file: file.into(),
        line: e.line(),
        message: format!("not JSON: {e}"),
    })?;
    let jobs = v.as_array().ok_or_else(|| WorkloadError::File {
        file: file.into(),
        message: "the Philly job log is a JSON array of jobs".into(),
    })?;
    let mut out = Vec::new();
    for (k, j) in jobs.iter().enumerate() {
        let id = j.get("jobid").and_then(|x| x.as_str()).unwrap_or_default();
        let bad = |what: String| WorkloadError::File {
            file: file.into(),
            message: format!(
                "job {} ({}): {what}",
                k + 1,
                if id.is_empty() { "no jobid" } else { id }
            ),
        };
        if id.is_empty() {
            return Err(bad("jobid is missing".into()));
        }
        if j.get("status").and_then(|x| x.as_str()) == Some("Killed") {
            continue;
        }
        let submitted = j
            .get("submitted_time")
            .and_then(|x| x.as_str())
            .ok_or_else(|| bad("submitted_time is missing".into()))?;
        let t = parse_time(submitted)
            .ok_or_else(|| bad(format!("submitted_time {submitted:?} is not a time")))?;
        let attempts = j
            .get("attempts")
            .and_then(|x| x.as_array())
            .ok_or_else(|| bad("attempts is missing".into()))?;
        let (mut ran, mut gpus) = (0.0, 0u32);
        for (n, a) in attempts.iter().enumerate() {
            let time = |key: &str| -> Result<Option<f64>, WorkloadError> {
                match a.get(key) {
                    None | Some(serde_json::Value::Null) => Ok(None),
                    Some(serde_json::Value::String(s)) => {
                        parse_time(s).map(Some).ok_or_else(|| {
                            bad(format!("attempt {}: {key} {s:?} is not a time", n + 1))
                        })
                    }
                    Some(o) => Err(bad(format!("attempt {}: {key} {o} is not a time", n + 1))),
                }
            };
            if let (Some(s), Some(e)) = (time("start_time")?, time("end_time")?) {
                ran += (e - s).max(0.0);
            }
            let detail = a.get("detail").and_then(|d| d.as_array());
            let g: usize = detail
                .map(|d| {
                    d.iter()
                        .filter_map(|m| m.get("gpus").and_then(|g| g.as_array()))
                        .map(Vec::len)
                        .sum()
                })
                .unwrap_or(0);
            if g > 0 {
                gpus = g as u32;
            }
        }
        if gpus > 0 && ran > 0.0 {
            out.push((id.to_string(), t, gpus, ran));
        }
    }
    Ok(out)
}

fn parse_fmsim(csv: &Csv) -> Result<Vec<WorkloadJob>, WorkloadError> {
    let c = |n| csv.need(n);
    let (name, submit, model, task, gpus, batch, sharing, pipeline) = (
        c("name")?,
        c("submit_s")?,
        c("model")?,
        c("task")?,
        c("gpus")?,
        c("batch")?,
        c("sharing")?,
        c("pipeline")?,
    );
    let epochs = csv.col("epochs");
    let gpu_model = csv.col("gpu_model");
    let expert_parallel = csv.col("expert_parallel");
    let min_gpus = csv.col("min_gpus");
    let max_work_x = csv.col("max_work_x");
    let (slo, deadline_s, deadline_x) =
        (csv.col("slo"), csv.col("deadline_s"), csv.col("deadline_x"));
    let (queue, priority, preemptible) = (
        csv.col("queue"),
        csv.col("priority"),
        csv.col("preemptible"),
    );
    let mut out = Vec::new();
    for (line, r) in &csv.rows {
        let cell = |c: Option<usize>| c.map(|c| r[c].trim()).filter(|v| !v.is_empty());
        let queueing = Queueing {
            queue: cell(queue).unwrap_or_default().to_string(),
            priority: match cell(priority) {
                Some(p) => p
                    .parse()
                    .ok()
                    .filter(|p: &i32| (-1000..=1000).contains(p))
                    .ok_or_else(|| {
                        csv.err(
                            *line,
                            format!("priority: {p:?} is not an integer in -1000..1000"),
                        )
                    })?,
                None => 0,
            },
            preemptible: match (preemptible, cell(preemptible)) {
                (Some(c), Some(_)) => csv.flag(*line, r, c)?,
                _ => true,
            },
        };
        let g = csv.whole(*line, r, gpus)?;
        let b = csv.whole(*line, r, batch)?;
        if g == 0 || b == 0 {
            return Err(csv.err(*line, "gpus and batch must be > 0"));
        }
        for (col, what) in [(name, "name"), (model, "model"), (task, "task")] {
            if r[col].trim().is_empty() {
                return Err(csv.err(*line, format!("{what} is empty")));
            }
        }
        let ep = match epochs {
            Some(e) if !r[e].trim().is_empty() => Some(csv.num(*line, r, e)?).filter(|&x| x > 0.0),
            _ => None,
        };
        let least = match min_gpus {
            Some(c) if !r[c].trim().is_empty() => csv.whole(*line, r, c)?,
            _ => 0,
        };
        if least > g {
            return Err(csv.err(
                *line,
                format!("min_gpus: {least} is more than the job's {g} gpus"),
            ));
        }
        let max_x = match max_work_x {
            Some(c) if !r[c].trim().is_empty() => {
                let x = csv.num(*line, r, c)?;
                if !(1.0..=100.0).contains(&x) {
                    return Err(csv.err(
                        *line,
                        format!(
                            "max_work_x: {x} is not in 1..100 (the user's maximum iterations as a multiple of the work to the target)"
                        ),
                    ));
                }
                Some(x)
            }
            _ => None,
        };
        out.push(WorkloadJob {
            name: r[name].trim().into(),
            submit_s: csv.num(*line, r, submit)?,
            model: r[model].trim().into(),
            task: r[task].trim().into(),
            gpus: g,
            max_gpus: g,
            min_gpus: least,
            batch: b,
            sharing: csv.flag(*line, r, sharing)?,
            pipeline: csv.flag(*line, r, pipeline)?,
            epochs: ep,
            target_metric: None,
            curve_key: None,
            trace_gpu_s: None,
            gpu_model: gpu_model
                .map(|c| r[c].trim())
                .filter(|m| !m.is_empty())
                .map(String::from),
            expert_parallel: match expert_parallel {
                Some(c) if !r[c].trim().is_empty() => csv.whole(*line, r, c)?,
                _ => 0,
            },
            slo: slo_of(csv, *line, r, slo, deadline_s, deadline_x)?,
            queueing,
            max_work_x: max_x,
        });
    }
    Ok(out)
}

/// The `slo`, `deadline_s` and `deadline_x` cells of a row.
fn slo_of(
    csv: &Csv,
    line: usize,
    r: &[String],
    class: Option<usize>,
    deadline_s: Option<usize>,
    deadline_x: Option<usize>,
) -> Result<SloSpec, WorkloadError> {
    let cell = |c: Option<usize>| c.map(|c| r[c].trim()).filter(|v| !v.is_empty());
    let class = cell(class)
        .map(str::parse::<SloClass>)
        .transpose()
        .map_err(|e| csv.err(line, format!("slo: {e}")))?;
    let num = |c: Option<usize>| -> Result<Option<f64>, WorkloadError> {
        match c {
            Some(c) if !r[c].trim().is_empty() => Ok(Some(csv.num(line, r, c)?)),
            _ => Ok(None),
        }
    };
    let spec = SloSpec {
        class,
        deadline_s: num(deadline_s)?,
        deadline_x: num(deadline_x)?,
    };
    if spec.deadline_s.is_some() && spec.deadline_x.is_some() {
        return Err(csv.err(line, "deadline_s and deadline_x: give one of them"));
    }
    if spec.deadline_s.is_some_and(|d| d <= 0.0) || spec.deadline_x.is_some_and(|x| x <= 0.0) {
        return Err(csv.err(line, "deadline_s / deadline_x must be > 0"));
    }
    if spec.class().has_deadline() && spec.deadline_after(1.0).is_none() {
        return Err(csv.err(line, "slo: an SLO job needs deadline_s or deadline_x"));
    }
    Ok(spec)
}

fn parse_titan(csv: &Csv) -> Result<Vec<WorkloadJob>, WorkloadError> {
    let c = |n| csv.need(n);
    let (name, submit, app, gpus, batch, lr, steps, metric) = (
        c("name")?,
        c("submission_time")?,
        c("application")?,
        c("num_gpus")?,
        c("target_batch_size")?,
        c("target_lr")?,
        c("target_gradient_steps")?,
        c("target_metric")?,
    );
    let mut out = Vec::new();
    for (line, r) in &csv.rows {
        let (model, task) = r[app]
            .trim()
            .split_once('@')
            .ok_or_else(|| csv.err(*line, format!("application {:?} is not model@task", r[app])))?;
        let g = csv.whole(*line, r, gpus)?;
        let b = csv.whole(*line, r, batch)?;
        if g == 0 || b == 0 {
            return Err(csv.err(*line, "num_gpus and target_batch_size must be > 0"));
        }
        // Exact parse of the target (see the anchor notes: the published
        // simulator reads it one unit in the last place high).
        let target = csv.num(*line, r, metric).ok();
        out.push(WorkloadJob {
            name: r[name].trim().into(),
            submit_s: csv.num(*line, r, submit)?,
            model: model.into(),
            task: task.replace('#', "/"),
            gpus: g,
            max_gpus: g,
            min_gpus: 0,
            batch: b,
            sharing: true,
            pipeline: false,
            epochs: None,
            target_metric: target,
            curve_key: Some(format!(
                "lr={},grad_accum={}",
                r[lr].trim(),
                r[steps].trim()
            )),
            trace_gpu_s: None,
            gpu_model: None,
            expert_parallel: 0,
            slo: SloSpec::default(),
            queueing: Queueing::default(),
            max_work_x: None,
        });
    }
    Ok(out)
}

/// Helios / Philly: arrivals, GPU counts and GPU-time from the trace, the
/// fine-tuning task from the catalog.
fn parse_trace(
    csv: &Csv,
    tasks: &[(String, String)],
    id: &str,
    gpus: &str,
    submit: &str,
    duration: &str,
    state: Option<&str>,
) -> Result<Vec<WorkloadJob>, WorkloadError> {
    if tasks.is_empty() {
        return Err(WorkloadError::File {
            file: csv.file.clone(),
            message: "the task catalog has no tasks to assign".into(),
        });
    }
    let (id, gpus, submit, duration) = (
        csv.need(id)?,
        csv.need(gpus)?,
        csv.need(submit)?,
        csv.need(duration)?,
    );
    let state = state.and_then(|s| csv.col(s));
    let mut raw = Vec::new();
    for (line, r) in &csv.rows {
        let g = csv.whole(*line, r, gpus)?;
        if g == 0 {
            continue; // CPU-only jobs
        }
        if let Some(s) = state
            && matches!(r[s].trim(), "CANCELLED" | "Killed" | "killed")
        {
            continue;
        }
        let t = parse_time(r[submit].trim()).ok_or_else(|| {
            csv.err(
                *line,
                format!("{}: {:?} is not a time", csv.header[submit], r[submit]),
            )
        })?;
        let d = csv.num(*line, r, duration)?;
        raw.push((r[id].trim().to_string(), t, g, d));
    }
    trace_jobs(raw, tasks, &csv.file)
}

/// Jobs of a cluster trace — (id, submitted at, GPUs, run seconds) — each
/// given a catalog task by its id, arrivals from the first one.
fn trace_jobs(
    raw: Vec<(String, f64, u32, f64)>,
    tasks: &[(String, String)],
    file: &str,
) -> Result<Vec<WorkloadJob>, WorkloadError> {
    if tasks.is_empty() {
        return Err(WorkloadError::File {
            file: file.into(),
            message: "the task catalog has no tasks to assign".into(),
        });
    }
    let t0 = raw.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    Ok(raw
        .into_iter()
        .map(|(name, t, g, d)| {
            let (model, task) = task_of(&name, tasks);
            WorkloadJob {
                name,
                submit_s: t - t0,
                model: model.clone(),
                task: task.clone(),
                gpus: g.min(64),
                max_gpus: g.min(64),
                min_gpus: 0,
                batch: 32 * g.min(64),
                sharing: true,
                pipeline: false,
                epochs: None,
                target_metric: None,
                curve_key: None,
                trace_gpu_s: Some(d * f64::from(g)),
                gpu_model: None,
                expert_parallel: 0,
                slo: SloSpec::default(),
                queueing: Queueing::default(),
                max_work_x: None,
            }
        })
        .collect())
}

/// Seconds from a number or a `YYYY-MM-DD HH:MM:SS` timestamp (UTC).
fn parse_time(s: &str) -> Option<f64> {
    if let Ok(v) = s.parse::<f64>() {
        return v.is_finite().then_some(v);
    }
    let (date, time) = s.split_once([' ', 'T'])?;
    let d: Vec<i64> = date
        .split('-')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let t: Vec<f64> = time
        .trim_end_matches('Z')
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if d.len() != 3 || t.len() != 3 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m, day) = (if d[1] <= 2 { d[0] - 1 } else { d[0] }, d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + t[0] * 3600.0 + t[1] * 60.0 + t[2])
}

/// Writes a workload in fmsim's format.
pub fn to_csv(jobs: &[WorkloadJob]) -> String {
    let mut s = String::from(
        "name,submit_s,model,task,gpus,batch,sharing,pipeline,epochs,gpu_model,expert_parallel,slo,deadline_s,deadline_x,queue,priority,preemptible,min_gpus,max_work_x\n",
    );
    for j in jobs {
        let num = |v: Option<f64>| v.map(|v| format!("{v}")).unwrap_or_default();
        s += &format!(
            "{},{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            j.name,
            j.submit_s,
            j.model,
            j.task,
            j.gpus,
            j.batch,
            u8::from(j.sharing),
            u8::from(j.pipeline),
            j.epochs.map(|e| format!("{e:.3}")).unwrap_or_default(),
            j.gpu_model.as_deref().unwrap_or_default(),
            j.expert_parallel,
            j.slo.class.map(SloClass::as_str).unwrap_or_default(),
            num(j.slo.deadline_s),
            num(j.slo.deadline_x),
            j.queueing.queue,
            j.queueing.priority,
            u8::from(j.queueing.preemptible),
            j.min_gpus,
            num(j.max_work_x),
        );
    }
    s
}

#[cfg(test)]
mod tests;
