//! Task catalog: how much work each fine-tuning task is, alone and merged.
//!
//! Per model: per task, the samples of one epoch and the epochs to reach
//! the target alone; per ordered pair `A->B`, the epochs B needs when it
//! starts from A's output (temporal transfer); per pair `A|B`, the epochs
//! each task needs inside the joint multi-task job (spatial transfer).
//! Entries are either epochs or per-epoch metric curves (then the epochs
//! are the first epoch reaching the job's target, else the curve's length).
//!
//! Two JSON layouts are read: fmsched's own (below, written by
//! `fmsim catalog`) and the published TitanSched `task-curves.json` layout
//! (`models.M.alone.T."lr=…,grad_accum=…".curve`, `models.M.temporal."A->B".curve`,
//! `models.M.spatial."A|B".T.curve`).
//!
//! ```json
//! {"models": {"roberta-base": {
//!    "tasks": {"rte": {"samples_per_epoch": 2490, "epochs": 4.0}},
//!    "temporal": {"mnli->rte": {"epochs": 1.5}},
//!    "spatial": {"mnli|rte": {"mnli": {"epochs": 3.0}, "rte": {"epochs": 2.0}}}}}}
//! ```
//!
//! The **default catalog** ([`Catalog::default_synthetic`]) ships with fmsim so
//! it works without any published data. Tasks and their training-set sizes
//! are public datasets' (GLUE train splits, Wang et al. 2019; CIFAR-100,
//! Fashion-MNIST, MNIST, Food-101, Imagenette; Alpaca, Dolly, GSM8K);
//! epochs to target alone are drawn in [2, 10]; transfer gains `G` are drawn
//! log-normally, `1 + G = exp(0.1 + 0.8·z)` clipped to [0.5, 10], which gives
//! what the papers publish: speedups up to 10× and a little over half of
//! the pairs helpful (`G ≥ 0`; Ymir Fig. 3, Table 2). Every draw is a hash
//! of the names, so the catalog is the same on every machine.

use std::collections::BTreeMap;

use fmsched_estimator::curve_prior::{CurveLibrary, Metric, Start};
use serde_json::{Value, json};

/// Epochs, or a metric curve per epoch (higher is better).
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    Epochs(f64),
    Curve(Vec<f64>),
}

impl Work {
    /// Epochs to reach `target` (a curve without a target runs its length).
    pub fn epochs(&self, target: Option<f64>) -> f64 {
        match self {
            Work::Epochs(e) => *e,
            Work::Curve(c) => match target {
                Some(t) => c
                    .iter()
                    .position(|&m| m >= t)
                    .map_or(c.len() as f64, |i| (i + 1) as f64),
                None => c.len() as f64,
            },
        }
    }
}

/// The metric an entry names (`"metric": "eval_accuracy"`), if any.
fn metric_of(v: &Value) -> Option<String> {
    v.get("metric")
        .and_then(Value::as_str)
        .filter(|m| !m.trim().is_empty())
        .map(str::to_string)
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskInfo {
    pub samples_per_epoch: f64,
    /// Alone: one entry, or one per curve key ("lr=…,grad_accum=…").
    pub alone: BTreeMap<String, Work>,
    /// The metric its curves measure, as the catalog names it (the
    /// published layout's `"metric": "eval_accuracy"`; fmsched's own
    /// `tasks.T.metric`), if it says: the learned prior reads the metric's
    /// best value from it ([`Metric::named`]).
    pub metric: Option<String>,
}

impl TaskInfo {
    /// Its metric as the learned prior reads it (curves are higher-is-better).
    pub fn prior_metric(&self) -> Metric {
        Metric::named(self.metric.as_deref().unwrap_or(""), false)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelTasks {
    pub tasks: BTreeMap<String, TaskInfo>,
    /// (A, B) → B's work after A.
    pub temporal: BTreeMap<(String, String), Work>,
    /// (A, B) with A < B → (A's work, B's work) in the joint job.
    pub spatial: BTreeMap<(String, String), (Work, Work)>,
}

/// Per task, a workload's jobs with a metric target: each one's curve key
/// (the `alone` entry it trains on, else the task's first) and target.
pub type JobTargets = BTreeMap<String, Vec<(Option<String>, f64)>>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Catalog {
    pub models: BTreeMap<String, ModelTasks>,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("{0}: {1}")]
    Invalid(String, String),
}

/// Deterministic uniform in (0, 1) from a name.
fn unit(name: &str) -> f64 {
    let mut h = fmsched_core::hash::fnv1a(name.as_bytes());
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Standard normal from a name (Box–Muller).
fn normal(name: &str) -> f64 {
    let (u1, u2) = (unit(&format!("{name}#1")), unit(&format!("{name}#2")));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Rounds to 4 decimals (exact through JSON).
fn r4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// `1 + G` of a synthetic pair.
fn synthetic_factor(name: &str) -> f64 {
    (0.1 + 0.8 * normal(name)).exp().clamp(0.5, 10.0)
}

const LANGUAGE: [(&str, f64); 8] = [
    ("mnli", 392_702.0),
    ("qqp", 363_846.0),
    ("qnli", 104_743.0),
    ("sst2", 67_349.0),
    ("cola", 8_551.0),
    ("stsb", 5_749.0),
    ("mrpc", 3_668.0),
    ("rte", 2_490.0),
];
const VISION: [(&str, f64); 6] = [
    ("cifar100", 50_000.0),
    ("fashion_mnist", 60_000.0),
    ("mnist", 60_000.0),
    ("food101", 75_750.0),
    ("imagenette", 9_469.0),
    ("cats_vs_dogs", 23_262.0),
];
const INSTRUCT: [(&str, f64); 3] = [
    ("alpaca", 52_002.0),
    ("dolly", 15_011.0),
    ("gsm8k", 7_473.0),
];

impl Catalog {
    /// The shipped synthetic catalog (see the module docs).
    pub fn default_synthetic() -> Catalog {
        let mut c = Catalog::default();
        // (models, their tasks with training-set sizes)
        type Family<'a> = (&'a [&'a str], &'a [(&'a str, f64)]);
        let families: [Family; 3] = [
            (
                &[
                    "roberta-base",
                    "roberta-large",
                    "bert-base",
                    "bert-large",
                    "switch-base-8",
                    "switch-base-16",
                ],
                &LANGUAGE,
            ),
            (&["vit-base", "vit-large"], &VISION),
            (&["llama-2-7b", "mistral-7b"], &INSTRUCT),
        ];
        for (models, tasks) in families {
            for &model in models {
                let mut m = ModelTasks::default();
                for &(t, n) in tasks {
                    let epochs = (2.0 + 8.0 * unit(&format!("{model}|{t}|epochs"))).round();
                    m.tasks.insert(
                        t.to_string(),
                        TaskInfo {
                            samples_per_epoch: n,
                            alone: BTreeMap::from([(String::new(), Work::Epochs(epochs))]),
                            metric: None,
                        },
                    );
                }
                let names: Vec<&str> = tasks.iter().map(|t| t.0).collect();
                for &a in &names {
                    for &b in &names {
                        if a == b {
                            continue;
                        }
                        let eb = m.tasks[b].alone[""].epochs(None);
                        let ea = m.tasks[a].alone[""].epochs(None);
                        let f = synthetic_factor(&format!("{model}|{a}->{b}"));
                        m.temporal
                            .insert((a.into(), b.into()), Work::Epochs(r4((eb / f).max(0.25))));
                        if a < b {
                            let fa = synthetic_factor(&format!("{model}|{b}=>{a}|spatial"));
                            let fb = synthetic_factor(&format!("{model}|{a}=>{b}|spatial"));
                            m.spatial.insert(
                                (a.into(), b.into()),
                                (
                                    Work::Epochs(r4((ea / fa).max(0.25))),
                                    Work::Epochs(r4((eb / fb).max(0.25))),
                                ),
                            );
                        }
                    }
                }
                c.models.insert(model.to_string(), m);
            }
        }
        c
    }

    /// Every (model, task) pair, in order.
    pub fn tasks(&self) -> Vec<(String, String)> {
        self.models
            .iter()
            .flat_map(|(m, t)| t.tasks.keys().map(move |k| (m.clone(), k.clone())))
            .collect()
    }

    /// The tasks cluster traces without tasks (pollux, helios, philly)
    /// draw from: those of models that run data-parallel on every GPU type
    /// of `cluster`, as a trace job may ask for any GPU count (a model that
    /// runs only as a pipeline there takes whole 4-GPU groups).
    pub fn trace_tasks(
        &self,
        lut: &fmsched_estimator::lut::Lut,
        cluster: &[crate::cluster::NodeGroup],
    ) -> Vec<(String, String)> {
        self.tasks()
            .into_iter()
            .filter(|(m, _)| {
                cluster.iter().all(|g| {
                    lut.data_parallel(m, &fmsched_estimator::analytic::gpu_family(&g.gpu_type))
                })
            })
            .collect()
    }

    pub fn task(&self, model: &str, task: &str) -> Option<&TaskInfo> {
        self.models.get(model)?.tasks.get(task)
    }

    /// The prior of the learned estimator ([`fmsched_estimator::curve_prior`])
    /// for a job of `task`, built as the scheduler builds it from its
    /// completed jobs ([`CurveLibrary::add_finished`]: each finished job's
    /// curve and target), with every curve that involves `task` left out
    /// (a new task's job sees only other tasks' finished jobs), plus the
    /// shipped curve shapes. The finished jobs: the workload's jobs of the
    /// model's other tasks (`targets`) on their curves alone; each temporal
    /// curve A ↦ B involving neither task, with the median target of B's
    /// jobs; and each task's curve in a spatial pair A|B involving neither
    /// task, with the median target of that task's jobs (a merged job that
    /// completed is a finished job of the model, as the scheduler's prior
    /// reads it). A curve no workload job gives a target to is no finished
    /// job's and stays out. `estimator-accuracy` measures the same prior.
    pub fn prior_library(&self, model: &str, task: &str, targets: &JobTargets) -> CurveLibrary {
        let mut lib = CurveLibrary::new();
        if let Some(m) = self.models.get(model) {
            let metric = |t: &str| {
                m.tasks
                    .get(t)
                    .map(TaskInfo::prior_metric)
                    .unwrap_or_default()
            };
            // Curves read from a catalog and targets read from a workload
            // are finite (checked on load).
            for (t, jobs) in targets.iter().filter(|(t, _)| t.as_str() != task) {
                let Some(info) = m.tasks.get(t) else { continue };
                for (key, target) in jobs {
                    let work = key
                        .as_ref()
                        .and_then(|k| info.alone.get(k))
                        .or_else(|| info.alone.values().next());
                    if let Some(Work::Curve(c)) = work {
                        let _ = lib.add_finished_as(c, *target, metric(t), Start::Alone);
                    }
                }
            }
            // The median target of a task's jobs, if it has any.
            let median = |t: &str| {
                let mut ts: Vec<f64> = targets.get(t)?.iter().map(|j| j.1).collect();
                ts.sort_by(f64::total_cmp);
                ts.get(ts.len() / 2).copied()
            };
            let spatial = m
                .spatial
                .iter()
                .filter(|((a, b), _)| a != task && b != task)
                .flat_map(|((a, b), (wa, wb))| [(a, wa), (b, wb)]);
            let temporal = m
                .temporal
                .iter()
                .filter(|((a, b), _)| a != task && b != task)
                .map(|((_, b), w)| (b, w));
            // (the task whose curve it is, the curve) of every pair: each
            // trained from, or beside, another task.
            for (t, w) in temporal.chain(spatial) {
                if let (Work::Curve(c), Some(target)) = (w, median(t)) {
                    let _ = lib.add_finished_as(c, target, metric(t), Start::Transferred);
                }
            }
        }
        lib.extended(&CurveLibrary::shipped())
    }

    /// B's work after A (temporal), if known.
    pub fn temporal(&self, model: &str, a: &str, b: &str) -> Option<&Work> {
        self.models
            .get(model)?
            .temporal
            .get(&(a.to_string(), b.to_string()))
    }

    /// (A's, B's) work in the joint job, if known.
    pub fn spatial(&self, model: &str, a: &str, b: &str) -> Option<(&Work, &Work)> {
        let m = self.models.get(model)?;
        if let Some((x, y)) = m.spatial.get(&(a.to_string(), b.to_string())) {
            return Some((x, y));
        }
        m.spatial
            .get(&(b.to_string(), a.to_string()))
            .map(|(x, y)| (y, x))
    }

    /// Reads either layout (see the module docs).
    pub fn from_json(origin: &str, text: &str) -> Result<Catalog, CatalogError> {
        let bad = |m: String| CatalogError::Invalid(origin.to_string(), m);
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let models = v
            .get("models")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no \"models\" object".into()))?;
        let mut out = Catalog::default();
        for (model, mv) in models {
            let mut m = ModelTasks::default();
            let work = |path: &str, w: &Value| -> Result<Work, CatalogError> {
                if let Some(e) = w.get("epochs") {
                    let e = e.as_f64().filter(|e| e.is_finite() && *e > 0.0);
                    return e
                        .map(Work::Epochs)
                        .ok_or_else(|| bad(format!("{path}.epochs must be a number > 0")));
                }
                let c = w
                    .get("curve")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad(format!("{path}: needs \"epochs\" or \"curve\"")))?;
                let pts: Option<Vec<f64>> = c
                    .iter()
                    .map(|p| {
                        p.as_array()
                            .and_then(|p| p.get(1))
                            .and_then(Value::as_f64)
                            .or_else(|| p.as_f64())
                    })
                    .collect();
                let pts = pts.filter(|p| !p.is_empty()).ok_or_else(|| {
                    bad(format!(
                        "{path}.curve must be a list of [epoch, metric] or metrics"
                    ))
                })?;
                Ok(Work::Curve(pts))
            };
            if let Some(tasks) = mv.get("tasks").and_then(Value::as_object) {
                for (t, tv) in tasks {
                    let path = format!("models.{model}.tasks.{t}");
                    let n = tv
                        .get("samples_per_epoch")
                        .and_then(Value::as_f64)
                        .filter(|n| *n > 0.0)
                        .ok_or_else(|| {
                            bad(format!("{path}.samples_per_epoch must be a number > 0"))
                        })?;
                    m.tasks.insert(
                        t.clone(),
                        TaskInfo {
                            samples_per_epoch: n,
                            alone: BTreeMap::from([(String::new(), work(&path, tv)?)]),
                            metric: metric_of(tv),
                        },
                    );
                }
            }
            if let Some(alone) = mv.get("alone").and_then(Value::as_object) {
                for (t, per_key) in alone {
                    let info = m.tasks.entry(t.clone()).or_default();
                    for (k, w) in per_key.as_object().into_iter().flatten() {
                        if info.metric.is_none() {
                            info.metric = metric_of(w);
                        }
                        info.alone.insert(
                            k.clone(),
                            work(&format!("models.{model}.alone.{t}.{k}"), w)?,
                        );
                    }
                }
            }
            for (k, w) in mv
                .get("temporal")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let (a, b) = k.split_once("->").ok_or_else(|| {
                    bad(format!(
                        "models.{model}.temporal: key {k:?} is not \"A->B\""
                    ))
                })?;
                m.temporal.insert(
                    (a.into(), b.into()),
                    work(&format!("models.{model}.temporal.{k}"), w)?,
                );
            }
            for (k, w) in mv
                .get("spatial")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let (a, b) = k.split_once('|').ok_or_else(|| {
                    bad(format!("models.{model}.spatial: key {k:?} is not \"A|B\""))
                })?;
                let path = format!("models.{model}.spatial.{k}");
                let wa = work(
                    &format!("{path}.{a}"),
                    w.get(a)
                        .ok_or_else(|| bad(format!("{path}: no entry for {a}")))?,
                )?;
                let wb = work(
                    &format!("{path}.{b}"),
                    w.get(b)
                        .ok_or_else(|| bad(format!("{path}: no entry for {b}")))?,
                )?;
                let (a, b, wa, wb) = if a <= b {
                    (a, b, wa, wb)
                } else {
                    (b, a, wb, wa)
                };
                m.spatial.insert((a.into(), b.into()), (wa, wb));
            }
            out.models.insert(model.clone(), m);
        }
        Ok(out)
    }

    /// fmsched's own layout.
    pub fn to_json(&self) -> Value {
        let work = |w: &Work| match w {
            Work::Epochs(e) => json!({ "epochs": e }),
            Work::Curve(c) => json!({ "curve": c }),
        };
        let mut models = serde_json::Map::new();
        for (name, m) in &self.models {
            let tasks: serde_json::Map<String, Value> = m
                .tasks
                .iter()
                .map(|(t, info)| {
                    let mut v = info.alone.values().next().map(work).unwrap_or(json!({}));
                    v["samples_per_epoch"] = json!(info.samples_per_epoch);
                    if let Some(m) = &info.metric {
                        v["metric"] = json!(m);
                    }
                    (t.clone(), v)
                })
                .collect();
            let temporal: serde_json::Map<String, Value> = m
                .temporal
                .iter()
                .map(|((a, b), w)| (format!("{a}->{b}"), work(w)))
                .collect();
            let spatial: serde_json::Map<String, Value> = m
                .spatial
                .iter()
                .map(|((a, b), (wa, wb))| (format!("{a}|{b}"), json!({ a: work(wa), b: work(wb) })))
                .collect();
            models.insert(
                name.clone(),
                json!({ "tasks": tasks, "temporal": temporal, "spatial": spatial }),
            );
        }
        json!({ "models": models })
    }

    /// Sets the samples per epoch of `task` (of `model`, or of every model
    /// that has it); returns how many entries it set.
    pub fn set_samples_per_epoch(&mut self, model: Option<&str>, task: &str, n: f64) -> usize {
        let mut set = 0;
        for (m, tasks) in &mut self.models {
            if model.is_some_and(|want| want != m) {
                continue;
            }
            if let Some(info) = tasks.tasks.get_mut(task) {
                info.samples_per_epoch = n;
                set += 1;
            }
        }
        set
    }

    /// Fills missing samples-per-epoch from another catalog (the published
    /// curves carry none).
    pub fn fill_samples_from(&mut self, other: &Catalog) {
        for (model, m) in &mut self.models {
            for (t, info) in &mut m.tasks {
                if info.samples_per_epoch <= 0.0
                    && let Some(o) = other.task(model, t)
                {
                    info.samples_per_epoch = o.samples_per_epoch;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published curves are read to the exact double their decimal names.
    /// A job stops on the first evaluation at or above its target, and the
    /// published targets are their curves' best values to the last digit:
    /// read a unit in the last place low (serde_json's default float
    /// parser is off by one on some inputs), such a curve never reached its
    /// target and the job ran all its epochs.
    #[test]
    fn curve_values_are_read_exactly() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut off = 0;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // 16–17 significant digits in [0, 1), as the published metrics.
            let text = format!("0.{:017}", x % 100_000_000_000_000_000);
            let json: Value = serde_json::from_str(&format!("[{text}]")).unwrap();
            let exact: f64 = text.parse().unwrap();
            off += usize::from(json[0].as_f64() != Some(exact));
        }
        assert_eq!(off, 0, "{off} of 20,000 values read inexactly");
    }

    #[test]
    fn default_catalog_matches_the_published_transfer_ranges() {
        let c = Catalog::default_synthetic();
        let mut pairs = 0;
        let mut helpful = 0;
        let mut best: f64 = 0.0;
        for (model, m) in &c.models {
            for ((a, b), w) in &m.temporal {
                let alone = m.tasks[b].alone[""].epochs(None);
                let speedup = alone / w.epochs(None);
                pairs += 1;
                if speedup >= 1.0 {
                    helpful += 1;
                }
                best = best.max(speedup);
                assert!(speedup <= 10.0 + 1e-9, "{model} {a}->{b}: {speedup}");
            }
        }
        let share = f64::from(helpful) / f64::from(pairs);
        assert!(
            (0.5..0.7).contains(&share),
            "a little over half helpful: {share}"
        );
        assert!(best > 4.0, "large speedups exist: {best}");
        // The same on every run.
        assert_eq!(c, Catalog::default_synthetic());
    }

    #[test]
    fn both_layouts_read_and_round_trip() {
        let c = Catalog::default_synthetic();
        let again = Catalog::from_json("c.json", &c.to_json().to_string()).unwrap();
        assert_eq!(again, c);
        let anchor = r#"{"models": {"vit": {
            "alone": {"cifar100": {"lr=1e-3,grad_accum=1": {"curve": [[1.0, 0.5], [2.0, 0.8], [3.0, 0.9]], "metric": "eval_accuracy"}}},
            "temporal": {"mnist->cifar100": {"curve": [[1.0, 0.85], [2.0, 0.95]]}},
            "spatial": {"mnist|cifar100": {"mnist": {"curve": [[0.99, 0.9]]}, "cifar100": {"curve": [[0.99, 0.7], [1.99, 0.91]]}}}}}}"#;
        let a = Catalog::from_json("task-curves.json", anchor).unwrap();
        let alone = &a.task("vit", "cifar100").unwrap().alone["lr=1e-3,grad_accum=1"];
        assert_eq!(alone.epochs(Some(0.85)), 3.0);
        assert_eq!(
            alone.epochs(Some(0.99)),
            3.0,
            "never reached: the curve's length"
        );
        assert_eq!(
            a.temporal("vit", "mnist", "cifar100")
                .unwrap()
                .epochs(Some(0.9)),
            2.0
        );
        let (wc, wm) = a.spatial("vit", "cifar100", "mnist").unwrap();
        assert_eq!((wc.epochs(Some(0.9)), wm.epochs(Some(0.9))), (2.0, 1.0));
        let e = Catalog::from_json(
            "x.json",
            r#"{"models": {"m": {"temporal": {"ab": {"epochs": 1}}}}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("\"A->B\""), "{e}");
        let e = Catalog::from_json(
            "x.json",
            r#"{"models": {"m": {"tasks": {"t": {"epochs": 1}}}}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("samples_per_epoch"), "{e}");
    }

    #[test]
    fn estimate_prior_library_holds_other_tasks_jobs_alone_temporal_and_spatial() {
        let curve = |v: f64| format!("{{\"curve\": [[1.0, {v}], [2.0, 0.9], [3.0, 0.95]]}}");
        let json = format!(
            r#"{{"models": {{"vit": {{
            "alone": {{"a": {{"k": {a}}}, "b": {{"k": {b}}}, "c": {{"k": {c}}}}},
            "temporal": {{"a->b": {t}, "b->c": {t}}},
            "spatial": {{"a|c": {{"a": {s}, "c": {s}}}, "b|c": {{"b": {s}, "c": {s}}}}}}}}}}}"#,
            a = curve(0.5),
            b = curve(0.6),
            c = curve(0.7),
            t = curve(0.8),
            s = curve(0.85),
        );
        let cat = Catalog::from_json("task-curves.json", &json).unwrap();
        let mut targets = JobTargets::new();
        for t in ["a", "b", "c"] {
            targets.insert(t.into(), vec![(Some("k".into()), 0.9), (None, 0.93)]);
        }
        // A job of a: b's and c's jobs alone (2 each), the temporal pair
        // b->c, and both tasks of the spatial pair b|c; a->b and a|c
        // involve a and are left out.
        let lib = cat.prior_library("vit", "a", &targets);
        assert_eq!(lib.examples(), 2 + 2 + 1 + 2);
        // Each finished job's curve is a shape too, as in the scheduler.
        assert_eq!(lib.jobs(), lib.examples());
        // A task without workload jobs has no target, and its curves are
        // no finished job's: b's jobs alone and b in b|c.
        targets.remove("c");
        let lib = cat.prior_library("vit", "a", &targets);
        assert_eq!(lib.examples(), 2 + 1);
        assert_eq!(lib.jobs(), 2 + 1);
    }
}
