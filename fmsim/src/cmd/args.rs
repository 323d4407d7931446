//! The command line's arguments: every subcommand and its flags (clap).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use fmsched_core::policy::PlacementRule;
use fmsched_sim::engine::LayerMode;
use fmsched_sim::workload;
use fmsched_sim::workload::Format;

use crate::cmd::generate::GenerateArgs;

/// Trace-driven simulator of fmsched's scheduling policies.
#[derive(Parser, Debug)]
#[command(version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// Simulate one policy on a workload.
    Run {
        #[command(flatten)]
        sim: SimArgs,
        /// Policy: ymir, ymir-no-merge, fifo, srtf, tiresias, optimus, themis,
        /// pollux, unisched, chronus, edf, hydra, lyra, gandiva, icefrog,
        /// icefrog-no-sharing, lucid.
        #[arg(long, default_value = "ymir")]
        policy: String,
    },
    /// Lyra's evaluation (thesis 002 §3.7) on one workload and inference
    /// cluster (`--inference-nodes`): FIFO without loans or scaling (the
    /// baseline), loaning alone (FIFO on loaned servers), opportunistic
    /// (FIFO on idle inference servers, taken back at random), elastic scaling
    /// alone (lyra without loans), Lyra, Lyra with the Random and SCF
    /// reclaims, and the elastic schedulers Gandiva-style (scale out only
    /// when nothing waits), Optimus (AFS-style greedy marginal gain) and
    /// Pollux without loans: queuing time, JCT,
    /// preemptions and collateral per reclaim, loaned GPU usage.
    Lyra {
        #[command(flatten)]
        sim: SimArgs,
    },
    /// Simulate several policies on the same workload, side by side.
    Compare {
        #[command(flatten)]
        sim: SimArgs,
        /// Comma-separated policies.
        #[arg(
            long,
            default_value = "ymir,ymir-no-merge,srtf,tiresias,optimus,themis,pollux,fifo"
        )]
        policies: String,
    },
    /// Robustness of Ymir: avg and p99 JCT of Ymir against the best
    /// baseline at each estimate-noise level, with the learned estimator's
    /// own errors replayed (when the workload has metric curves), at each
    /// transfer-gain noise level (Ymir §7.3, Fig. 8a), and over Ymir's
    /// knobs (srtf weight, interval) with exact estimates. Baselines see
    /// the same estimates as Ymir at each point.
    Sweep {
        #[command(flatten)]
        sim: SimArgs,
        /// Baselines (the best by average JCT at each point is shown).
        #[arg(long, default_value = "optimus,srtf,tiresias,themis")]
        baselines: String,
        /// Estimate-noise levels (each job's remaining times scaled by a
        /// fixed factor in [1 − e, 1 + e]).
        #[arg(long, default_value = "0,0.1,0.2,0.4")]
        noise: String,
        /// Transfer-gain noise levels for Ymir (the work each merge or warm
        /// start is predicted to save scaled by a fixed factor per pair in
        /// [1 − e, 1 + e]; times exact); the baselines, which do not
        /// merge, are those of exact estimates.
        #[arg(long, default_value = "0.1,0.2,0.4")]
        gain_noise_levels: String,
        /// Ymir `srtf_weight` values (exact estimates).
        #[arg(long, default_value = "0,0.5,1,2")]
        srtf_weights: String,
        /// Ymir `interval_s` values (exact estimates).
        #[arg(long, default_value = "60,120,300")]
        intervals: String,
        /// Ymir `resize_horizon_s` values (exact estimates).
        #[arg(long, default_value = "0,150,300,600")]
        resize_horizons: String,
    },
    /// Generate a workload (Pollux-style size classes, Poisson arrivals).
    Generate(GenerateArgs),
    /// AutoSched offline: replay a workload with the policy's knobs fixed
    /// at their defaults, fixed at the best found on the whole workload,
    /// re-tuned every period on the past hour (SelfTune-like), and re-tuned
    /// every period by AutoSched (predicted arrivals and remaining times);
    /// print the outcome of each and the tuner's cost.
    Tune {
        #[command(flatten)]
        sim: SimArgs,
        /// tiresias (average JCT) or themis (share of jobs with ρ ≤ 1).
        #[arg(long, default_value = "tiresias")]
        policy: String,
        /// Seconds between tunings.
        #[arg(long, default_value_t = 3600.0)]
        every: f64,
        /// Configurations sampled per tuning.
        #[arg(long, default_value_t = 12)]
        samples: usize,
        /// Configurations tried on the whole workload for the fixed-best row.
        #[arg(long, default_value_t = 16)]
        fixed_samples: usize,
        /// Adopt a configuration only when it is this much better.
        #[arg(long, default_value_t = 1.1)]
        threshold: f64,
        /// Simulate the first stage on the whole predicted trace, not the
        /// aggregated one.
        #[arg(long)]
        no_aggregate: bool,
        /// Rows: default, fixed, selftune, autosched (comma-separated).
        #[arg(long, default_value = "default,fixed,selftune,autosched")]
        modes: String,
        /// Threads for the simulations (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write every tuning decision (CSV) here.
        #[arg(long)]
        decisions: Option<PathBuf>,
    },
    /// Print the shipped task catalog (fmsched's JSON layout).
    Catalog,
    /// Replay the published FM-1 workloads as the authors' simulator does
    /// and compare with their table.
    Fidelity {
        /// The published TitanSched data: `task-curves.json`,
        /// `job-epochs-FM-1.csv`, `profiles/V100/`, `workloads/`.
        #[arg(long, env = "FMSIM_ANCHOR_DIR")]
        anchor_dir: PathBuf,
        /// Write per-policy job CSVs, summary JSON and plots here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Only these workloads (comma-separated models, e.g. vit,roberta-base).
        #[arg(long)]
        only: Option<String>,
        /// Only these policies (comma-separated).
        #[arg(long)]
        policies: Option<String>,
        /// Knob `name=value` of the Ymir rows (repeatable), e.g.
        /// `wait_weight=0`; the baselines run as the authors' simulator
        /// runs them.
        #[arg(long = "knob", value_name = "NAME=VALUE")]
        knobs: Vec<String>,
    },
    /// PromptTuner's evaluation (thesis 004 §4.6): 20-minute traces of
    /// prompt-tuning requests (Table 4.6's low, medium and high loads over
    /// GPT2-Base, GPT2-Large and Vicuna-7B, or `--trace`) at each SLO
    /// emergence S (SLO = duration × S + the model's cold start), replayed
    /// under prompttuner (warm per-model pools), infless (INFless-like: a
    /// cold start per request, GPUs billed while held) and elasticflow
    /// (ElasticFlow-like: deadline-aware shares, no warm runtimes, the
    /// cluster billed whole): SLO violation rate, GPU-hours and dollars
    /// billed, warm and cold starts, the loop's decision time.
    Prompttuner(PromptTunerArgs),
    /// ICEFROG's evaluation (TPDS'25 §V): ICEFROG-style workloads (`120 ×
    /// load` jobs from hours 3-6 of a Philly-shaped trace, tasks by
    /// GPU-time) on 12 × 4 A100 by default; IceShare with the layer tuner
    /// and GPU sharing against Lucid-style sharing, Optimus and Pollux,
    /// each also with tuned FreezeOut (`+`); 60 s reallocation overhead.
    /// Prints average JCT (all / small / medium / large) and time per round.
    Icefrog {
        /// Loads (1 = 120 jobs), comma-separated.
        #[arg(long, default_value = "1,2,4")]
        loads: String,
        /// Workload seeds (each load is averaged over them).
        #[arg(long, default_value = "1,2,3")]
        seeds: String,
        /// Systems: icefrog, icefrog-no-sharing, icefrog-no-layers,
        /// lucid[+], optimus[+], pollux[+] (`+`: tuned FreezeOut).
        #[arg(
            long,
            default_value = "icefrog,lucid,lucid+,optimus,optimus+,pollux,pollux+"
        )]
        systems: String,
        /// Node groups `TYPE:COUNT:GPUS` (repeatable).
        #[arg(long, default_value = "A100:12:4")]
        nodes: Vec<String>,
        /// Scale the nodes and the jobs by this (ICEFROG §V-E: 5, 10, 20).
        #[arg(long, default_value_t = 1)]
        scale: u32,
        /// Policy knob `name=value` for the systems that have it, e.g.
        /// `partition_jobs=0` (IceShare unpartitioned).
        #[arg(long = "knob", value_name = "NAME=VALUE")]
        knobs: Vec<String>,
        /// Sample jobs from this trace (any workload format with GPU-times:
        /// philly, helios) instead of a Philly-shaped one.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Simulations at once (default: every core).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Time PromptTuner's allocation decision (Algorithms 1 and 2 over
    /// generated warm and cold pools) at a queue of `--requests` pending
    /// prompt-tuning requests over `--models` models: the figure the 50 ms
    /// loop must stay well under.
    BenchPrompttuner {
        /// Pending prompt-tuning requests.
        #[arg(long, default_value_t = 200)]
        requests: usize,
        /// Models the requests and the pools are spread over.
        #[arg(long, default_value_t = 8)]
        models: usize,
        /// Decisions timed.
        #[arg(long, default_value_t = 2000)]
        rounds: usize,
        /// Prompts in the Prompt Bank timed (build and lookup; 0 = none).
        #[arg(long, default_value_t = 3000)]
        prompts: usize,
        /// Length of each prompt's activation feature vector.
        #[arg(long, default_value_t = 256)]
        features: usize,
    },
    /// Time the Ymir MILP per round on the anchor workloads (when present)
    /// and on a generated 60 × 4-GPU, 3,000-job, 2× load workload.
    BenchSolver {
        /// The published TitanSched data (as for `fidelity`); without it only
        /// the generated workload is timed.
        #[arg(long, env = "FMSIM_ANCHOR_DIR")]
        anchor_dir: Option<PathBuf>,
        /// Jobs of the generated workload.
        #[arg(long, default_value_t = 3000)]
        jobs: usize,
    },
}

/// `--estimates`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EstimateSource {
    Exact,
    Learned,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct SimArgs {
    /// Workload CSV (fmsim, titan/adaptdl, helios or philly layout).
    #[arg(long)]
    pub(crate) workload: PathBuf,
    /// Workload format (default: guessed from the header).
    #[arg(long)]
    pub(crate) format: Option<Format>,
    /// Task catalog JSON (fmsched or task-curves.json layout); default: the shipped one.
    #[arg(long)]
    pub(crate) catalog: Option<PathBuf>,
    /// Training samples per epoch of a task, `TASK=N` or `MODEL/TASK=N`
    /// (repeatable), or a file of such lines, or a per-job CSV with
    /// `application` (`<model>@<task>`) and `progress_per_epoch` columns
    /// (the TitanSched `job-epochs-FM-1.csv`): the published curves carry
    /// none, and a task the shipped catalog does not know needs one to
    /// count its epochs.
    #[arg(long, value_name = "TASK=N|FILE")]
    pub(crate) samples_per_epoch: Vec<String>,
    /// Folder of profile CSVs (fmsched layout, or <GPU>/<model>_<layout>.csv);
    /// default: the shipped analytic profiles.
    #[arg(long)]
    pub(crate) profiles: Option<PathBuf>,
    /// Nodes: a count (of `--gpus-per-node` `--gpu-type` GPUs each; default
    /// 8), or `TYPE:COUNT:GPUS` for one group of a mixed cluster,
    /// repeatable: `--nodes V100:8:4 --nodes A100:4:8`.
    #[arg(long, value_name = "COUNT|TYPE:COUNT:GPUS")]
    pub(crate) nodes: Vec<String>,
    /// GPUs of each node when `--nodes` is a count.
    #[arg(long, default_value_t = 4)]
    pub(crate) gpus_per_node: u32,
    /// GPU type of every node when `--nodes` is a count.
    #[arg(long, default_value = "V100")]
    pub(crate) gpu_type: String,
    /// Cluster CSV, one node group per row: `gpu_type,count,gpus_per_node`
    /// (instead of `--nodes`).
    #[arg(long, conflicts_with = "nodes")]
    pub(crate) cluster: Option<PathBuf>,
    /// Queues with quotas: a TOML file of `[[queues]]` tables (name,
    /// parent, guaranteed_gpus, over_quota_weight, limit_gpus, models,
    /// users, merge_across_queues; docs/queues.md). The workload's `queue`
    /// column names them.
    #[arg(long)]
    pub(crate) queues: Option<PathBuf>,
    /// Profiling seconds per new job (0 = none).
    #[arg(long, default_value_t = 60.0)]
    pub(crate) profile_s: f64,
    /// Rounds on events, as the service's `scheduling.event_round_gap`: a
    /// job's arrival, completion or profiling run's end brings the next
    /// round forward to now, at least this many seconds after the last one
    /// (unset: a round per interval only).
    #[arg(long, value_name = "SECONDS")]
    pub(crate) event_gap: Option<f64>,
    /// Rounds for deadlines, as the service's
    /// `scheduling.deadline_round_gap`: on such an event, a job with a
    /// deadline that would miss it waiting for the periodic round brings
    /// that round forward to now, at least this many seconds after the last
    /// one (0: off; off too with `--round-origin` or `--event-gap`, which
    /// brings every event's round forward).
    #[arg(long, value_name = "SECONDS", default_value_t = fmsched_sim::engine::DEFAULT_DEADLINE_GAP_S)]
    pub(crate) deadline_gap: f64,
    /// Estimation error the policy sees: each job's remaining times scaled
    /// by a fixed factor in [1 − e, 1 + e] (0 = oracle estimates).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) estimate_noise: f64,
    /// Transfer-gain error the policy sees (Ymir §7.3, Fig. 8a): the work
    /// each merge or warm start is predicted to save a job scaled by a
    /// fixed factor per pair in [1 − e, 1 + e]; the pair trains as it
    /// truly does (0 = the true gains).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) gain_noise: f64,
    /// Which estimates the policy sees: `exact` (the truth, or the truth
    /// with --estimate-noise) or `learned` (the estimator's epochs-to-target
    /// from each job's metric curve so far, its prior the same model's other
    /// tasks' curves: its own errors replayed; needs a catalog of per-epoch
    /// curves and jobs with target_metric).
    #[arg(long, value_enum, default_value_t = EstimateSource::Exact)]
    pub(crate) estimates: EstimateSource,
    /// Checkpoint seconds charged on every (re)start.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) checkpoint_s: f64,
    /// Context-switch seconds (default: the profile's).
    #[arg(long)]
    pub(crate) context_switch_s: Option<f64>,
    /// Write per-job CSV, summary JSON and the JCT CDF plot here.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Give the workload's jobs service classes and deadlines as the
    /// UniSched evaluation does (§5.4.2): `slo` (all strict), `mix1`
    /// (strict and best-effort), `mix2` (strict, soft and best-effort);
    /// deadlines U[1.1, 2] × each job's time alone; a fifth of the jobs
    /// stop on a metric target (`max_work_x`: their user's maximum is up to
    /// 1.45 × their work). Replaces the workload's own `slo` and
    /// `max_work_x` columns.
    #[arg(long, value_name = "slo|mix1|mix2")]
    pub(crate) slo_mix: Option<workload::SloMix>,
    /// Seed of `--slo-mix`.
    #[arg(long, default_value_t = 1)]
    pub(crate) slo_seed: u64,
    /// Policy knob `name=value` (repeatable), e.g. `interval_s=60`,
    /// `srtf_weight=0`, `lease_s=300`; an unknown knob lists the policy's.
    #[arg(long = "knob", value_name = "NAME=VALUE")]
    pub(crate) knobs: Vec<String>,
    /// Each job's epochs from a per-job file (`job,epochs_pandas_default,…`:
    /// the TitanSched `job-epochs-FM-1.csv` layout) instead of from its
    /// task's curve; target metrics are then read one unit in the last place
    /// high, as the authors' parser reads them.
    #[arg(long, value_name = "FILE")]
    pub(crate) job_epochs: Option<PathBuf>,
    /// Each job may grow to its `max_num_gpus` from a per-job file (same
    /// layout) instead of the GPUs it asks for.
    #[arg(long, value_name = "FILE")]
    pub(crate) job_max_gpus: Option<PathBuf>,
    /// Placement of a data-parallel group: `pack` (fmsched's: over the nodes
    /// with the most free GPUs) or `fewest-nodes` (the TitanSched
    /// simulator's: on ⌈gpus / node size⌉ nodes, else wait).
    #[arg(long, value_name = "RULE", default_value = "pack", value_parser = parse_placement)]
    pub(crate) placement: PlacementRule,
    /// Rounds at multiples of the interval from this time (s) instead of from
    /// the first arrival (the TitanSched simulator: 0).
    #[arg(long, value_name = "S")]
    pub(crate) round_origin: Option<f64>,
    /// These policies (comma-separated) decide on the remaining times the
    /// TitanSched simulator predicts instead of exact ones (see
    /// `EstimateModel::TitanSched`; `fidelity` gives them to Optimus).
    #[arg(long, value_name = "POLICIES")]
    pub(crate) titansched_estimates: Option<String>,
    /// Inference servers that may be loaned to training (Lyra),
    /// `TYPE:COUNT:GPUS`, repeatable; none: no loans.
    #[arg(long, value_name = "TYPE:COUNT:GPUS")]
    pub(crate) inference_nodes: Vec<String>,
    /// The inference cluster's utilisation over time: a CSV of
    /// `t_s,utilisation` rows (a share or a percentage), repeated daily.
    #[arg(long, value_name = "FILE")]
    pub(crate) inference_trace: Option<PathBuf>,
    /// Without a trace: a daily sine of this mean utilisation and
    /// peak-to-trough ratio (the thesis' inference cluster: 0.65:2.2).
    #[arg(long, value_name = "MEAN:RATIO", default_value = "0.65:2.2")]
    pub(crate) inference_diurnal: String,
    /// Share of the inference servers never loaned.
    #[arg(long, default_value_t = 0.02)]
    pub(crate) loan_headroom: f64,
    /// Seconds between the loan orchestrator's decisions.
    #[arg(long, default_value_t = 300.0)]
    pub(crate) loan_every_s: f64,
    /// How a reclaim picks the servers it returns: lyra (fewest
    /// preemptions, §3.4), random, scf (fewest jobs first) or exhaustive.
    #[arg(long, default_value = "lyra")]
    pub(crate) reclaim: String,
    /// Make this share of the jobs elastic (their maximum twice their
    /// request, the thesis' "Ideal" scaling range), chosen by `--slo-seed`.
    #[arg(long, value_name = "SHARE")]
    pub(crate) elastic_share: Option<f64>,
    /// Layer elasticity (ICEFROG): `off`, `tuner` (every job may freeze up
    /// to 90 % of its layers; the layer tuner picks them, Eq. 15) or
    /// `freezeout` (a tuned FreezeOut schedule).
    #[arg(long, value_enum, default_value_t = LayerMode::Off)]
    pub(crate) layers: LayerMode,
    /// GPU sharing (ICEFROG Eq. 8): policies that share (icefrog, lucid)
    /// may put two one-GPU jobs on one GPU.
    #[arg(long)]
    pub(crate) gpu_sharing: bool,
}

fn parse_placement(s: &str) -> Result<PlacementRule, String> {
    match s {
        "pack" => Ok(PlacementRule::Pack),
        "fewest-nodes" => Ok(PlacementRule::FewestNodes),
        _ => Err(format!("{s:?}: expected pack or fewest-nodes")),
    }
}

/// The flags of `fmsim prompttuner`.
#[derive(Args, Debug)]
pub(crate) struct PromptTunerArgs {
    /// Loads, comma-separated: low, medium, high.
    #[arg(long, default_value = "low,medium,high")]
    pub(crate) load: String,
    /// SLO emergences S, comma-separated.
    #[arg(long, default_value = "0.5,1,1.5")]
    pub(crate) slo_emergence: String,
    /// Systems, comma-separated: prompttuner, infless, elasticflow.
    #[arg(long, default_value = "prompttuner,infless,elasticflow")]
    pub(crate) systems: String,
    /// GPUs in the cluster.
    #[arg(long, default_value_t = 32)]
    pub(crate) gpus: u32,
    /// Replay this trace (CSV: arrival_s,model,gpus,duration_s) instead
    /// of generated ones (`--load` is then ignored).
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Write the generated trace of each load to DIR/<load>.csv.
    #[arg(long, value_name = "DIR")]
    pub(crate) write_traces: Option<PathBuf>,
    /// A model's cold start, NAME=SECONDS (repeatable): adds a model a
    /// trace names, or overrides a built-in one.
    #[arg(long = "cold-start", value_name = "NAME=SECONDS")]
    pub(crate) cold_start: Vec<String>,
    /// The loop's period, milliseconds.
    #[arg(long, default_value_t = 50.0)]
    pub(crate) tick_ms: f64,
    /// Idle warm GPUs go back to the cold pool after this many seconds,
    /// or `break-even`: after the model's cold start (idling longer
    /// costs more than loading it again).
    #[arg(long, default_value = "60")]
    pub(crate) idle_release: String,
    /// Spread of cold starts across instances (a cold start on A GPUs
    /// waits for the slowest).
    #[arg(long, default_value_t = 0.3)]
    pub(crate) init_jitter: f64,
    /// Relative Gaussian error of the planners' duration estimates.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) estimate_error: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
}
