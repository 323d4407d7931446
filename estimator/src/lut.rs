//! Throughput lookup table (Ymir §4.3: `S(a, cfgs)`).
//!
//! Keyed by (model, GPU type, configuration variant — AMP, frozen layers,
//! gradient checkpointing, PETL, pipeline, expert parallelism) and then by
//! placement shape and
//! local batch. Tables come from profile CSVs: the Pollux/AdaptDL layouts
//! published FM profiles use (`placement,local_bsz,step_time,sync_time`,
//! `num_nodes,num_replicas,local_bsz,step_time,sync_time`, `local_bsz,gpu_memory`,
//! `app,time_cost`) and fmsched's own layout (see `docs/profiles.md`), which
//! the node agent's profiling runs fill.
//!
//! Lookup rules (those of the published simulator, so results compare):
//! - a placement is canonicalised by dropping zero entries and taking the
//!   smallest rotation of its digit string (`404` → `44`, `31` → `13`);
//! - a known placement is interpolated linearly over `local_bsz`
//!   (extrapolated linearly from the two nearest points outside the range);
//! - an unknown placement is interpolated linearly over
//!   (min(nodes, 16), replicas, local_bsz) in the scalability table;
//! - a global batch `B` on `R` GPUs runs `local = ceil(B / R)` per GPU, with
//!   gradient accumulation `s = ceil(local / max_local)` when `local` exceeds
//!   the largest profiled (and memory-feasible) local batch; one iteration
//!   then takes `step + (s − 1) · (step − sync)` (synchronisation happens
//!   once per iteration).
//! - a configuration whose memory exceeds the GPU's is infeasible, not timed.
//!
//! Measured step times (online updates) overlay the table per exact key:
//! the estimate is `(w0 · table + n · mean) / (w0 + n)` with `w0 = 3`, and a
//! sample further than 3× from the current estimate, or (after 5 samples)
//! more than `4σ + 5 %` from the mean, is rejected as an outlier.

pub mod variants;

use std::collections::BTreeMap;

/// Configuration variant of Ymir's `cfgs` beyond batch and GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Variant {
    pub amp: bool,
    pub frozen_layers: u32,
    pub gradient_checkpointing: bool,
    /// "" = full fine-tuning, else the PETL method name ("lora", ...).
    pub petl: String,
    pub pipeline: bool,
    /// A Mixture-of-Experts job's expert-parallel group (GPUs its experts
    /// are spread over, each group on one node; `resources.expert_parallel`);
    /// 0 = none: a dense model, or an MoE model whose every GPU holds all
    /// experts. A table is measured at one group size: a smaller group
    /// holds more experts per GPU and sends less over the all-to-all, so a
    /// job's rows never come from another group size's table when its own
    /// exists (see [`Lut::step_time`]).
    pub expert_parallel: u32,
}

impl Variant {
    /// The variant published profiles are measured in: AMP on, nothing else.
    pub fn base() -> Self {
        Variant {
            amp: true,
            ..Default::default()
        }
    }

    /// The variant a task trains in: its precision, activation
    /// checkpointing, PETL method and frozen layers, in a pipeline or not.
    pub fn of_settings(
        s: &fmsched_core::trainer::TrainingSettings,
        pipeline: bool,
        expert_parallel: u32,
    ) -> Self {
        Variant {
            amp: s.amp,
            frozen_layers: s.frozen_layers,
            gradient_checkpointing: s.gradient_checkpointing,
            petl: s.petl.clone(),
            pipeline,
            expert_parallel: expert_group(expert_parallel),
        }
    }

    /// The variant a job spec asks for (the scheduler estimates with it;
    /// the trainer gets the same settings).
    pub fn of_spec(spec: &fmsched_core::job::JobSpec) -> Self {
        Self::of_settings(
            &fmsched_core::trainer::TrainingSettings::of(spec),
            spec.resources.pipeline_parallel,
            spec.resources.expert_parallel,
        )
    }
}

/// The variant's expert-parallel group of a spec's or table's
/// `expert_parallel`: 0 and 1 both mean none.
pub fn expert_group(expert_parallel: u32) -> u32 {
    if expert_parallel > 1 {
        expert_parallel
    } else {
        0
    }
}

/// Full key of one measurement.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ThroughputKey {
    pub model: String,
    pub gpu_type: String,
    /// Canonical placement (digit string of GPUs per node).
    pub placement: String,
    pub local_bsz: u32,
    pub grad_accum: u32,
    pub variant: Variant,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub local_bsz: u32,
    pub step: f64,
    pub sync: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalePoint {
    pub nodes: u32,
    pub replicas: u32,
    pub local_bsz: u32,
    pub step: f64,
    pub sync: f64,
}

/// One model × GPU × variant table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Canonical placement → points sorted by local batch.
    pub placements: BTreeMap<String, Vec<Point>>,
    pub scalability: Vec<ScalePoint>,
    /// (local batch, GiB) sorted by batch.
    pub memory: Vec<(u32, f64)>,
    /// Seconds to stop one job and start another (the maximum measured).
    pub context_switch_s: Option<f64>,
}

/// Result of a step-time lookup.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepTime {
    pub step: f64,
    pub sync: f64,
    pub interpolated: bool,
    pub feasible: bool,
}

/// Time of one optimizer iteration for a global batch on some GPUs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IterationTime {
    pub seconds: f64,
    pub local_bsz: u32,
    pub grad_accum: u32,
    pub feasible: bool,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LutError {
    #[error("no throughput profile for model {model:?} on {gpu_type:?}")]
    NoProfile { model: String, gpu_type: String },
    #[error("placement {0:?} must be a non-empty string of digits with at least one GPU")]
    BadPlacement(String),
    #[error("{field}: must be > 0")]
    Zero { field: &'static str },
    #[error("{origin} line {line}: {message}")]
    Csv {
        origin: String,
        line: usize,
        message: String,
    },
    #[error(
        "unknown profile layout {0:?}; expected placements, scalability, memory, context_switch or fmsched"
    )]
    Layout(String),
}

/// Drops zeros and returns the lexicographically smallest rotation.
pub fn canonical_placement(p: &str) -> Result<String, LutError> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LutError::BadPlacement(p.to_string()));
    }
    let digits: Vec<u8> = p.bytes().filter(|&b| b != b'0').collect();
    if digits.is_empty() {
        return Err(LutError::BadPlacement(p.to_string()));
    }
    let n = digits.len();
    let best = (0..n)
        .map(|r| {
            digits[r..]
                .iter()
                .chain(&digits[..r])
                .copied()
                .collect::<Vec<u8>>()
        })
        .min()
        .unwrap_or_default();
    Ok(String::from_utf8(best).unwrap_or_default())
}

/// Placement of `gpus` GPUs packed onto as few nodes of `per_node` as possible.
pub fn packed_placement(gpus: u32, per_node: u32) -> String {
    let per_node = per_node.clamp(1, 9);
    let full = gpus / per_node;
    let rest = gpus % per_node;
    let mut s: String =
        std::iter::repeat_n(char::from(b'0' + per_node as u8), full as usize).collect();
    if rest > 0 {
        s.insert(0, char::from(b'0' + rest as u8));
    }
    s
}

fn placement_shape(p: &str) -> (u32, u32) {
    (p.len() as u32, p.bytes().map(|b| u32::from(b - b'0')).sum())
}

/// Linear interpolation of `y` over sorted `xs`; linear extrapolation from
/// the two nearest points outside; a single point is returned as is.
fn interp(xs: &[f64], ys: &[f64], x: f64) -> (f64, bool) {
    debug_assert_eq!(xs.len(), ys.len());
    match xs.len() {
        0 => (f64::NAN, true),
        1 => (ys[0], x != xs[0]),
        n => {
            if let Some(i) = xs.iter().position(|&v| v == x) {
                return (ys[i], false);
            }
            let i = match xs.iter().position(|&v| v > x) {
                Some(0) => 1,
                Some(i) => i,
                None => n - 1,
            };
            let (x0, x1, y0, y1) = (xs[i - 1], xs[i], ys[i - 1], ys[i]);
            (y0 + (y1 - y0) * (x - x0) / (x1 - x0), true)
        }
    }
}

impl Profile {
    fn points_step(&self, pts: &[Point], bsz: u32) -> (f64, f64, bool) {
        let xs: Vec<f64> = pts.iter().map(|p| f64::from(p.local_bsz)).collect();
        let steps: Vec<f64> = pts.iter().map(|p| p.step).collect();
        let syncs: Vec<f64> = pts.iter().map(|p| p.sync).collect();
        let (s, i1) = interp(&xs, &steps, f64::from(bsz));
        let (y, i2) = interp(&xs, &syncs, f64::from(bsz));
        (s, y.max(0.0), i1 || i2)
    }

    /// Step and sync time of a canonical placement at a local batch.
    pub fn step(&self, placement: &str, bsz: u32) -> Option<(f64, f64, bool)> {
        if let Some(pts) = self.placements.get(placement).filter(|p| !p.is_empty()) {
            return Some(self.points_step(pts, bsz));
        }
        let (nodes, replicas) = placement_shape(placement);
        if !self.scalability.is_empty() {
            return Some(self.scalability_step(nodes.min(16), replicas, bsz));
        }
        // No scalability table: the known placement with the nearest shape.
        let nearest = self
            .placements
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .min_by_key(|(k, _)| {
                let (n, r) = placement_shape(k);
                (n.abs_diff(nodes) * 100 + r.abs_diff(replicas), (*k).clone())
            })?;
        let (s, y, _) = self.points_step(nearest.1, bsz);
        Some((s, y, true))
    }

    /// Linear over nodes, then replicas, then local batch.
    fn scalability_step(&self, nodes: u32, replicas: u32, bsz: u32) -> (f64, f64, bool) {
        let mut node_vals: Vec<u32> = self.scalability.iter().map(|p| p.nodes).collect();
        node_vals.sort_unstable();
        node_vals.dedup();
        let at_nodes = |n: u32| -> (f64, f64) {
            let mut reps: Vec<u32> = self
                .scalability
                .iter()
                .filter(|p| p.nodes == n)
                .map(|p| p.replicas)
                .collect();
            reps.sort_unstable();
            reps.dedup();
            let per_rep: Vec<(f64, f64)> = reps
                .iter()
                .map(|&r| {
                    let mut pts: Vec<Point> = self
                        .scalability
                        .iter()
                        .filter(|p| p.nodes == n && p.replicas == r)
                        .map(|p| Point {
                            local_bsz: p.local_bsz,
                            step: p.step,
                            sync: p.sync,
                        })
                        .collect();
                    pts.sort_by_key(|p| p.local_bsz);
                    let (s, y, _) = self.points_step(&pts, bsz);
                    (s, y)
                })
                .collect();
            let xs: Vec<f64> = reps.iter().map(|&r| f64::from(r)).collect();
            let s = interp(
                &xs,
                &per_rep.iter().map(|v| v.0).collect::<Vec<_>>(),
                f64::from(replicas),
            )
            .0;
            let y = interp(
                &xs,
                &per_rep.iter().map(|v| v.1).collect::<Vec<_>>(),
                f64::from(replicas),
            )
            .0;
            (s, y)
        };
        let per_node: Vec<(f64, f64)> = node_vals.iter().map(|&n| at_nodes(n)).collect();
        let xs: Vec<f64> = node_vals.iter().map(|&n| f64::from(n)).collect();
        // Clamp the node dimension to the measured range (no extrapolation
        // of network effects).
        let n = f64::from(nodes).clamp(xs[0], xs[xs.len() - 1]);
        let s = interp(&xs, &per_node.iter().map(|v| v.0).collect::<Vec<_>>(), n).0;
        let y = interp(&xs, &per_node.iter().map(|v| v.1).collect::<Vec<_>>(), n).0;
        (s, y.max(0.0), true)
    }

    /// GPU memory (GiB) at a local batch, if a memory table exists.
    pub fn memory_gib(&self, bsz: u32) -> Option<f64> {
        if self.memory.is_empty() {
            return None;
        }
        let xs: Vec<f64> = self.memory.iter().map(|m| f64::from(m.0)).collect();
        let ys: Vec<f64> = self.memory.iter().map(|m| m.1).collect();
        Some(interp(&xs, &ys, f64::from(bsz)).0)
    }

    /// Largest profiled local batch of a placement (or of the whole table).
    pub fn max_local_bsz(&self, placement: &str) -> u32 {
        self.placements
            .get(placement)
            .and_then(|p| p.last().map(|p| p.local_bsz))
            .or_else(|| self.scalability.iter().map(|p| p.local_bsz).max())
            .or_else(|| {
                self.placements
                    .values()
                    .filter_map(|p| p.last())
                    .map(|p| p.local_bsz)
                    .max()
            })
            .unwrap_or(1)
    }
}

/// Running mean/variance of measured step and sync times (Welford).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    pub n: u64,
    pub mean_step: f64,
    pub m2_step: f64,
    pub mean_sync: f64,
}

impl Measured {
    pub fn sd_step(&self) -> f64 {
        if self.n < 2 {
            0.0
        } else {
            (self.m2_step / (self.n - 1) as f64).sqrt()
        }
    }
}

/// Weight of the table value against measurements.
const PRIOR_WEIGHT: f64 = 3.0;

impl Lut {
    /// GPU memory (GiB) of `variant` of `model` on `gpu_type` at local
    /// batch `bsz`: its profile's memory table, or a profiled variant's
    /// adjusted by ICEFROG's memory factors; None without a table.
    pub fn memory_of(
        &self,
        model: &str,
        gpu_type: &str,
        variant: &Variant,
        layers: u32,
        bsz: u32,
    ) -> Option<f64> {
        let (profile, from) = self.base_profile(model, gpu_type, variant).ok()?;
        variant_memory(profile, from, variant, layers, bsz)
    }
}

/// GPU memory (GiB) of variant `to` at a local batch, from `profile`'s
/// memory table — its own, or (`from`) a profiled variant's adjusted by
/// ICEFROG's memory factors.
fn variant_memory(
    profile: &Profile,
    from: Option<&Variant>,
    to: &Variant,
    layers: u32,
    bsz: u32,
) -> Option<f64> {
    let Some(from) = from else {
        return profile.memory_gib(bsz);
    };
    let (m1, m2) = (profile.memory_gib(1)?, profile.memory_gib(2)?);
    let per_sample = (m2 - m1).max(0.0);
    let fixed = (m1 - per_sample).max(0.0);
    Some(variants::adjust_memory(
        fixed, per_sample, from, to, layers, bsz,
    ))
}

/// GPU memory of known GPU types (GiB), from NVIDIA's data sheets.
pub fn gpu_memory_gib(gpu_type: &str) -> Option<f64> {
    let t = gpu_type.to_ascii_uppercase();
    let known: [(&str, f64); 10] = [
        ("H200", 141.0),
        ("H100", 80.0),
        ("A100-40", 40.0),
        ("A100", 80.0),
        ("A800", 80.0),
        ("V100-16", 16.0),
        ("V100", 32.0),
        ("A10", 24.0),
        ("L4", 24.0),
        ("L40", 48.0),
    ];
    known.iter().find(|(k, _)| t.contains(k)).map(|(_, g)| *g)
}

/// The whole lookup table.
#[derive(Clone, Debug, Default)]
pub struct Lut {
    profiles: BTreeMap<(String, String), BTreeMap<Variant, Profile>>,
    measured: BTreeMap<ThroughputKey, Measured>,
    /// Per-GPU memory limit override (GiB) by GPU type.
    pub gpu_memory: BTreeMap<String, f64>,
}

/// Outcome of recording one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    Accepted,
    Outlier,
}

impl Lut {
    pub fn profile_mut(&mut self, model: &str, gpu_type: &str, v: &Variant) -> &mut Profile {
        self.profiles
            .entry((model.to_string(), gpu_type.to_string()))
            .or_default()
            .entry(v.clone())
            .or_default()
    }

    pub fn profile(&self, model: &str, gpu_type: &str, v: &Variant) -> Option<&Profile> {
        self.profiles
            .get(&(model.to_string(), gpu_type.to_string()))?
            .get(v)
    }

    /// (model, GPU type) pairs with any table.
    pub fn models(&self) -> impl Iterator<Item = (&str, &str)> {
        self.profiles.keys().map(|(m, g)| (m.as_str(), g.as_str()))
    }

    /// Whether the model runs data-parallel (not as a pipeline) on GPU type
    /// `gpu_type`: a table, and its smallest local batch fits the GPU's
    /// memory. A job of it can run there on any GPU count.
    pub fn data_parallel(&self, model: &str, gpu_type: &str) -> bool {
        let limit = self.memory_limit(gpu_type);
        self.profiles
            .get(&(model.to_string(), gpu_type.to_string()))
            .is_some_and(|variants| {
                variants.iter().any(|(v, p)| {
                    !v.pipeline
                        && match (limit, p.memory.first()) {
                            (Some(l), Some(&(_, gib))) => gib <= l,
                            _ => true,
                        }
                })
            })
    }

    pub fn has_model(&self, model: &str) -> bool {
        self.profiles.keys().any(|(m, _)| m == model)
    }

    /// GPU types profiled for a model.
    pub fn gpu_types(&self, model: &str) -> Vec<String> {
        self.profiles
            .keys()
            .filter(|(m, _)| m == model)
            .map(|(_, g)| g.clone())
            .collect()
    }

    fn base_profile(
        &self,
        model: &str,
        gpu: &str,
        v: &Variant,
    ) -> Result<(&Profile, Option<&Variant>), LutError> {
        let tables = self
            .profiles
            .get(&(model.to_string(), gpu.to_string()))
            .ok_or_else(|| LutError::NoProfile {
                model: model.into(),
                gpu_type: gpu.into(),
            })?;
        if let Some(p) = tables.get(v) {
            return Ok((p, None));
        }
        // Pipeline tables are never derived from data-parallel ones. An
        // expert-parallel job's table is its own group size's, else the
        // nearest measured one, used as measured (no formula moves a step
        // time between group sizes: the all-to-all's share of a step is
        // what profiles measure, Lina Table 4.1).
        let fallback = tables
            .iter()
            .filter(|(k, _)| k.pipeline == v.pipeline)
            .min_by_key(|(k, _)| {
                (
                    k.expert_parallel.abs_diff(v.expert_parallel),
                    k.frozen_layers,
                    k.gradient_checkpointing,
                    !k.petl.is_empty(),
                    !k.amp,
                )
            })
            .map(|(k, p)| (p, Some(k)));
        fallback.ok_or_else(|| LutError::NoProfile {
            model: model.into(),
            gpu_type: format!("{gpu} (pipeline={})", v.pipeline),
        })
    }

    /// Step and sync time of one exact configuration.
    pub fn step_time(&self, key: &ThroughputKey, layers: u32) -> Result<StepTime, LutError> {
        if key.local_bsz == 0 {
            return Err(LutError::Zero { field: "local_bsz" });
        }
        let placement = canonical_placement(&key.placement)?;
        let (profile, derived_from) = self.base_profile(&key.model, &key.gpu_type, &key.variant)?;
        let (mut step, mut sync, mut interpolated) = profile
            .step(&placement, key.local_bsz)
            .ok_or_else(|| LutError::NoProfile {
                model: key.model.clone(),
                gpu_type: key.gpu_type.clone(),
            })?;
        if let Some(from) = derived_from {
            let (s, y) = variants::adjust_variant(step, sync, from, &key.variant, layers);
            step = s;
            sync = y;
            interpolated = true;
        }
        let accum = key.grad_accum.max(1);
        step += f64::from(accum - 1) * (step - sync).max(0.0);
        let canon = ThroughputKey {
            placement,
            grad_accum: accum,
            ..key.clone()
        };
        if let Some(m) = self.measured.get(&canon).filter(|m| m.n > 0) {
            let n = m.n as f64;
            step = (PRIOR_WEIGHT * step + n * m.mean_step) / (PRIOR_WEIGHT + n);
            sync = (PRIOR_WEIGHT * sync + n * m.mean_sync) / (PRIOR_WEIGHT + n);
            interpolated = false;
        }
        let feasible = match (
            variant_memory(profile, derived_from, &key.variant, layers, key.local_bsz),
            self.memory_limit(&key.gpu_type),
        ) {
            (Some(need), Some(cap)) => need <= cap,
            _ => true,
        };
        Ok(StepTime {
            step: step.max(1e-9),
            sync: sync.clamp(0.0, step.max(1e-9)),
            interpolated,
            feasible,
        })
    }

    fn memory_limit(&self, gpu: &str) -> Option<f64> {
        self.gpu_memory
            .get(gpu)
            .copied()
            .or_else(|| gpu_memory_gib(gpu))
    }

    /// Time of one iteration of global batch `global_bsz` on `gpus` GPUs
    /// packed onto nodes of `per_node` GPUs (see the module docs).
    #[allow(clippy::too_many_arguments)]
    pub fn iteration_time(
        &self,
        model: &str,
        gpu_type: &str,
        gpus: u32,
        per_node: u32,
        global_bsz: u32,
        variant: &Variant,
        layers: u32,
    ) -> Result<IterationTime, LutError> {
        if gpus == 0 {
            return Err(LutError::Zero { field: "gpus" });
        }
        let placement = packed_placement(gpus, per_node);
        self.iteration_time_on(model, gpu_type, &placement, global_bsz, variant, layers)
    }

    /// Like [`Lut::iteration_time`], on an explicit placement (digit string
    /// of GPUs per node, e.g. "31" for a job spread over two nodes).
    pub fn iteration_time_on(
        &self,
        model: &str,
        gpu_type: &str,
        placement: &str,
        global_bsz: u32,
        variant: &Variant,
        layers: u32,
    ) -> Result<IterationTime, LutError> {
        if global_bsz == 0 {
            return Err(LutError::Zero {
                field: "global_batch_size",
            });
        }
        let placement = canonical_placement(placement)?;
        let gpus: u32 = placement.bytes().map(|b| u32::from(b - b'0')).sum();
        let (profile, derived_from) = self.base_profile(model, gpu_type, variant)?;
        let mut max_local = profile.max_local_bsz(&placement).max(1);
        if let (Some(cap), false) = (self.memory_limit(gpu_type), profile.memory.is_empty()) {
            let need = |b| variant_memory(profile, derived_from, variant, layers, b);
            // A variant that needs less memory per sample (checkpointing,
            // frozen layers) may run local batches past the profiled ones.
            if derived_from.is_some() {
                while max_local < 1024 && need(max_local * 2).is_some_and(|m| m <= cap) {
                    max_local *= 2;
                }
            }
            while max_local > 1 && need(max_local).is_some_and(|m| m > cap) {
                max_local -= 1;
            }
        }
        let local = global_bsz.div_ceil(gpus);
        let accum = local.div_ceil(max_local);
        let local = local.div_ceil(accum);
        let st = self.step_time(
            &ThroughputKey {
                model: model.into(),
                gpu_type: gpu_type.into(),
                placement,
                local_bsz: local,
                grad_accum: accum,
                variant: variant.clone(),
            },
            layers,
        )?;
        Ok(IterationTime {
            seconds: st.step,
            local_bsz: local,
            grad_accum: accum,
            feasible: st.feasible,
        })
    }

    /// Whether one replica of a job (`replica_gpus` GPUs on one node: one
    /// GPU of a data-parallel job, a pipeline's stages, an expert group)
    /// can run on `gpu_type` at all: the table's step time there is
    /// feasible (its memory fits at some local batch). An unknown answer
    /// (no profile for the type, a shape the table cannot name) counts as
    /// runnable: nothing is excluded on a guess.
    pub fn runs_on(
        &self,
        model: &str,
        gpu_type: &str,
        replica_gpus: u32,
        global_bsz: u32,
        variant: &Variant,
        layers: u32,
    ) -> bool {
        if !(1..=9).contains(&replica_gpus) {
            return true;
        }
        let placement = replica_gpus.to_string();
        match self.iteration_time_on(
            model,
            gpu_type,
            &placement,
            global_bsz.max(1),
            variant,
            layers,
        ) {
            Ok(it) => it.feasible && it.seconds.is_finite(),
            Err(_) => true,
        }
    }

    /// Context-switch seconds of a model on a GPU type (the maximum measured).
    pub fn context_switch_s(&self, model: &str, gpu_type: &str) -> Option<f64> {
        self.profiles
            .get(&(model.to_string(), gpu_type.to_string()))?
            .values()
            .filter_map(|p| p.context_switch_s)
            .reduce(f64::max)
    }

    /// Folds one measured step time into the table (see module docs).
    pub fn record(
        &mut self,
        key: &ThroughputKey,
        step: f64,
        sync: f64,
        layers: u32,
    ) -> Result<Recorded, LutError> {
        let mut key = key.clone();
        key.placement = canonical_placement(&key.placement)?;
        key.grad_accum = key.grad_accum.max(1);
        if !(step.is_finite() && step > 0.0 && sync.is_finite() && sync >= 0.0) {
            return Ok(Recorded::Outlier);
        }
        let current = self.step_time(&key, layers).ok().map(|s| s.step);
        let m = self.measured.entry(key).or_default();
        if let Some(c) = current
            && m.n < 5
            && (step > 3.0 * c || step < c / 3.0)
        {
            return Ok(Recorded::Outlier);
        }
        if m.n >= 5 && (step - m.mean_step).abs() > 4.0 * m.sd_step() + 0.05 * m.mean_step {
            return Ok(Recorded::Outlier);
        }
        m.n += 1;
        let d = step - m.mean_step;
        m.mean_step += d / m.n as f64;
        m.m2_step += d * (step - m.mean_step);
        m.mean_sync += (sync - m.mean_sync) / m.n as f64;
        Ok(Recorded::Accepted)
    }

    pub fn measured(&self) -> impl Iterator<Item = (&ThroughputKey, &Measured)> {
        self.measured.iter()
    }

    /// Restores persisted measurements.
    pub fn restore_measured(&mut self, key: ThroughputKey, m: Measured) {
        self.measured.insert(key, m);
    }

    /// Imports a CSV in one of the layouts (see the module docs); returns
    /// the number of rows read. Nothing is changed on error.
    pub fn import_csv(
        &mut self,
        model: &str,
        gpu_type: &str,
        layout: &str,
        origin: &str,
        csv: &str,
    ) -> Result<usize, LutError> {
        let rows = parse_csv(origin, csv)?;
        let v = Variant::base();
        let c = Cells { origin };
        match layout {
            "placements" => {
                let mut add = Vec::new();
                for (line, r) in &rows {
                    let p = r
                        .get("placement")
                        .ok_or_else(|| c.err(*line, "missing column \"placement\"".into()))?;
                    let p =
                        canonical_placement(p.trim()).map_err(|e| c.err(*line, e.to_string()))?;
                    let bsz = c.int(*line, r, "local_bsz")?;
                    if bsz == 0 {
                        return Err(c.err(*line, "local_bsz: must be > 0".into()));
                    }
                    add.push((
                        p,
                        Point {
                            local_bsz: bsz,
                            step: c.num(*line, r, "step_time")?,
                            sync: c.num(*line, r, "sync_time")?,
                        },
                    ));
                }
                let prof = self.profile_mut(model, gpu_type, &v);
                for (p, pt) in add {
                    let pts = prof.placements.entry(p).or_default();
                    pts.retain(|q| q.local_bsz != pt.local_bsz);
                    pts.push(pt);
                    pts.sort_by_key(|q| q.local_bsz);
                }
            }
            "scalability" => {
                let mut add = Vec::new();
                for (line, r) in &rows {
                    add.push(ScalePoint {
                        nodes: c.int(*line, r, "num_nodes")?.max(1),
                        replicas: c.int(*line, r, "num_replicas")?.max(1),
                        local_bsz: c.int(*line, r, "local_bsz")?.max(1),
                        step: c.num(*line, r, "step_time")?,
                        sync: c.num(*line, r, "sync_time")?,
                    });
                }
                self.profile_mut(model, gpu_type, &v)
                    .scalability
                    .extend(add);
            }
            "memory" => {
                let mut add = Vec::new();
                for (line, r) in &rows {
                    add.push((
                        c.int(*line, r, "local_bsz")?,
                        c.num(*line, r, "gpu_memory")?,
                    ));
                }
                let prof = self.profile_mut(model, gpu_type, &v);
                prof.memory.extend(add);
                prof.memory.sort_by_key(|m| m.0);
                prof.memory.dedup_by_key(|m| m.0);
            }
            "context_switch" => {
                let mut max: Option<f64> = None;
                for (line, r) in &rows {
                    let t = c.num(*line, r, "time_cost")?;
                    max = Some(max.map_or(t, |m: f64| m.max(t)));
                }
                if let Some(t) = max {
                    let prof = self.profile_mut(model, gpu_type, &v);
                    prof.context_switch_s = Some(prof.context_switch_s.map_or(t, |c| c.max(t)));
                }
            }
            "fmsched" => {
                let mut add = Vec::new();
                for (line, r) in &rows {
                    add.push(fmsched_row(&c, *line, r, model, gpu_type)?);
                }
                for row in add {
                    let prof = self.profile_mut(&row.model, &row.gpu_type, &row.variant);
                    let bsz = row.point.local_bsz;
                    let pts = prof.placements.entry(row.placement).or_default();
                    pts.retain(|q| q.local_bsz != bsz);
                    pts.push(row.point);
                    pts.sort_by_key(|q| q.local_bsz);
                    if let Some(gib) = row.memory_gib {
                        prof.memory.retain(|x| x.0 != bsz);
                        prof.memory.push((bsz, gib));
                        prof.memory.sort_by_key(|x| x.0);
                    }
                    if let Some(t) = row.context_switch_s {
                        prof.context_switch_s = Some(prof.context_switch_s.map_or(t, |c| c.max(t)));
                    }
                }
            }
            other => return Err(LutError::Layout(other.to_string())),
        }
        Ok(rows.len())
    }
}

/// Reads a CSV row's cells; every error names the file, line and column.
struct Cells<'a> {
    origin: &'a str,
}

impl Cells<'_> {
    fn err(&self, line: usize, message: String) -> LutError {
        LutError::Csv {
            origin: self.origin.to_string(),
            line,
            message,
        }
    }

    /// A finite number >= 0.
    fn num(&self, line: usize, row: &BTreeMap<String, String>, col: &str) -> Result<f64, LutError> {
        let raw = row
            .get(col)
            .ok_or_else(|| self.err(line, format!("missing column {col:?}")))?;
        let x: f64 = raw
            .trim()
            .parse()
            .map_err(|_| self.err(line, format!("{col}: {raw:?} is not a number")))?;
        if !x.is_finite() || x < 0.0 {
            return Err(self.err(line, format!("{col}: {raw:?} must be a finite number >= 0")));
        }
        Ok(x)
    }

    /// A whole number >= 0.
    fn int(&self, line: usize, row: &BTreeMap<String, String>, col: &str) -> Result<u32, LutError> {
        let x = self.num(line, row, col)?;
        if x.fract() != 0.0 || x > f64::from(u32::MAX) {
            return Err(self.err(line, format!("{col}: must be a whole number")));
        }
        Ok(x as u32)
    }
}

/// One row of fmsched's own layout (`model` and `gpu_type` default to the
/// import's), parsed before anything is changed.
fn fmsched_row(
    c: &Cells<'_>,
    line: usize,
    r: &BTreeMap<String, String>,
    model: &str,
    gpu_type: &str,
) -> Result<FmschedRow, LutError> {
    let flag = |col: &str| -> Result<bool, LutError> {
        match r.get(col).map(|s| s.trim()) {
            Some("1" | "true") => Ok(true),
            Some("0" | "false" | "") | None => Ok(false),
            Some(o) => Err(c.err(line, format!("{col}: {o:?} is not a boolean"))),
        }
    };
    let row_model = r
        .get("model")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .unwrap_or(model);
    let row_gpu = r
        .get("gpu_type")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .unwrap_or(gpu_type);
    let variant = Variant {
        amp: flag("amp")?,
        frozen_layers: if r.contains_key("frozen_layers") {
            c.int(line, r, "frozen_layers")?
        } else {
            0
        },
        gradient_checkpointing: flag("grad_ckpt")?,
        petl: r
            .get("petl")
            .map(|s| s.trim().to_string())
            .filter(|s| s != "none")
            .unwrap_or_default(),
        pipeline: flag("pipeline")?,
        expert_parallel: if r
            .get("expert_parallel")
            .is_some_and(|s| !s.trim().is_empty())
        {
            expert_group(c.int(line, r, "expert_parallel")?)
        } else {
            0
        },
    };
    let p = canonical_placement(r.get("placement").map(|s| s.trim()).unwrap_or(""))
        .map_err(|e| c.err(line, e.to_string()))?;
    let bsz = c.int(line, r, "local_bsz")?;
    if bsz == 0 {
        return Err(c.err(line, "local_bsz: must be > 0".into()));
    }
    let opt = |col: &str| -> Result<Option<f64>, LutError> {
        if r.get(col).is_some_and(|s| !s.trim().is_empty()) {
            c.num(line, r, col).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(FmschedRow {
        model: row_model.to_string(),
        gpu_type: row_gpu.to_string(),
        variant,
        placement: p,
        point: Point {
            local_bsz: bsz,
            step: c.num(line, r, "step_time")?,
            sync: c.num(line, r, "sync_time")?,
        },
        memory_gib: opt("gpu_memory_gib")?,
        context_switch_s: opt("context_switch_s")?,
    })
}

/// One row of fmsched's own layout, parsed before anything is changed.
struct FmschedRow {
    model: String,
    gpu_type: String,
    variant: Variant,
    placement: String,
    point: Point,
    memory_gib: Option<f64>,
    context_switch_s: Option<f64>,
}

/// One CSV data row: its line number and its cells by column name.
type CsvRow = (usize, BTreeMap<String, String>);

/// Parses a header-first CSV without quoting (the profile layouts need none)
/// into (line number, column → value) rows.
fn parse_csv(origin: &str, text: &str) -> Result<Vec<CsvRow>, LutError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let Some((_, header)) = lines.next() else {
        return Err(LutError::Csv {
            origin: origin.into(),
            line: 1,
            message: "empty file (a header row is required)".into(),
        });
    };
    let cols: Vec<String> = header.split(',').map(|c| c.trim().to_string()).collect();
    let mut out = Vec::new();
    for (i, l) in lines {
        let vals: Vec<&str> = l.split(',').collect();
        if vals.len() != cols.len() {
            return Err(LutError::Csv {
                origin: origin.into(),
                line: i + 1,
                message: format!("{} fields, the header has {}", vals.len(), cols.len()),
            });
        }
        out.push((
            i + 1,
            cols.iter()
                .cloned()
                .zip(vals.iter().map(|v| v.trim().to_string()))
                .collect(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
