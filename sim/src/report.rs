//! Results: the summary table, JSON, per-job CSV and the SVG plot of the
//! JCT CDF per policy.

use std::fmt::Write as _;

use serde_json::json;

use fmsched_core::slo;

use crate::engine::SimResult;

/// The figures of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub policy: String,
    pub jobs: usize,
    pub avg_jct_h: f64,
    pub p50_jct_h: f64,
    pub p99_jct_h: f64,
    pub makespan_h: f64,
    pub utilisation: f64,
    pub restarts: u32,
    pub merges_temporal: u32,
    pub merges_spatial: u32,
    /// Jobs started from a finished job's weights.
    pub warm_starts: u32,
    pub guard_splits: u32,
    /// Kept temporal merges split because B would finish sooner alone.
    pub merges_released: u32,
    /// Finish-time fairness ρ = JCT / time alone: mean and worst.
    pub ftf_mean: f64,
    pub ftf_max: f64,
    pub rounds: u32,
    pub fallbacks: u32,
    pub round_mean_ms: f64,
    pub round_p99_ms: f64,
    pub round_max_ms: f64,
    pub wall_s: f64,
    /// SLO jobs (strict and soft) of the workload.
    pub slo_jobs: usize,
    /// Weighted SLO violation rate `R^slo` (Eq. 5.15 as a violation: the
    /// mean share of its reward an SLO job lost), and the attainment, one
    /// minus it.
    pub slo_violation: f64,
    pub slo_attainment: f64,
    /// SLO jobs that missed their (first) deadline.
    pub deadline_misses: usize,
    /// SLO jobs whose first deadline comes before the floor under their
    /// JCT ([`crate::engine::JobResult::unreachable`]): every policy misses
    /// them. The same for every policy on one workload and cluster.
    pub slo_unreachable: usize,
    /// `R^slo` over the other SLO jobs: what the policy lost of what it
    /// could have earned.
    pub slo_violation_reachable: f64,
    /// Mean restarts (suspend/resume) per SLO job.
    pub slo_suspensions: f64,
    /// Mean JCT of best-effort jobs, hours.
    pub be_avg_jct_h: f64,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

pub fn summarize(r: &SimResult) -> Summary {
    let mut jct: Vec<f64> = r.jobs.iter().map(|j| j.jct_s / 3600.0).collect();
    jct.sort_by(f64::total_cmp);
    let ftf: Vec<f64> = r.jobs.iter().map(|j| j.ftf).collect();
    let mut rounds: Vec<f64> = r.round_wall_s.iter().map(|s| s * 1000.0).collect();
    rounds.sort_by(f64::total_cmp);
    let slo: Vec<&crate::engine::JobResult> =
        r.jobs.iter().filter(|j| !j.deadlines.is_empty()).collect();
    let slo_violation = mean(
        &slo.iter()
            .map(|j| slo::violation(&j.deadlines, j.finish_s))
            .collect::<Vec<_>>(),
    );
    let reachable: Vec<f64> = slo
        .iter()
        .filter(|j| !j.unreachable())
        .map(|j| slo::violation(&j.deadlines, j.finish_s))
        .collect();
    Summary {
        policy: r.policy.clone(),
        jobs: r.jobs.len(),
        avg_jct_h: mean(&jct),
        p50_jct_h: percentile(&jct, 50.0),
        p99_jct_h: percentile(&jct, 99.0),
        makespan_h: r.makespan_s / 3600.0,
        utilisation: r.gpu_utilisation,
        restarts: r.restarts,
        merges_temporal: r.merges_temporal,
        merges_spatial: r.merges_spatial,
        warm_starts: r.warm_starts,
        guard_splits: r.guard_splits,
        merges_released: r.merges_released,
        ftf_mean: mean(&ftf),
        ftf_max: ftf.iter().copied().fold(f64::NAN, f64::max),
        rounds: r.rounds,
        fallbacks: r.fallbacks,
        round_mean_ms: mean(&rounds),
        round_p99_ms: percentile(&rounds, 99.0),
        round_max_ms: rounds.last().copied().unwrap_or(f64::NAN),
        wall_s: r.wall_s,
        slo_jobs: slo.len(),
        slo_violation,
        slo_attainment: 1.0 - slo_violation,
        deadline_misses: slo
            .iter()
            .filter(|j| j.deadlines.first().is_some_and(|d| j.finish_s > d.by))
            .count(),
        slo_unreachable: slo.len() - reachable.len(),
        slo_violation_reachable: mean(&reachable),
        slo_suspensions: mean(
            &slo.iter()
                .map(|j| f64::from(j.restarts))
                .collect::<Vec<_>>(),
        ),
        be_avg_jct_h: mean(
            &r.jobs
                .iter()
                .filter(|j| j.deadlines.is_empty())
                .map(|j| j.jct_s / 3600.0)
                .collect::<Vec<_>>(),
        ),
    }
}

/// A fixed-width table, one row per policy.
pub fn table(rows: &[Summary]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<14} {:>5} {:>9} {:>9} {:>9} {:>10} {:>6} {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>8}",
        "policy",
        "jobs",
        "avg_jct_h",
        "p50_h",
        "p99_h",
        "makespan_h",
        "util",
        "restarts",
        "m_temp",
        "m_spat",
        "m_warm",
        "ftf_avg",
        "ftf_max",
        "fallbacks",
        "wall_s"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<14} {:>5} {:>9.3} {:>9.3} {:>9.3} {:>10.2} {:>5.1}% {:>8} {:>7} {:>7} {:>7} {:>8.2} {:>8.2} {:>9} {:>8.3}",
            r.policy,
            r.jobs,
            r.avg_jct_h,
            r.p50_jct_h,
            r.p99_jct_h,
            r.makespan_h,
            100.0 * r.utilisation,
            r.restarts,
            r.merges_temporal,
            r.merges_spatial,
            r.warm_starts,
            r.ftf_mean,
            r.ftf_max,
            r.fallbacks,
            r.wall_s
        );
    }
    if rows.iter().any(|r| r.slo_jobs > 0) {
        let _ = writeln!(
            s,
            "\n{:<14} {:>8} {:>13} {:>11} {:>7} {:>11} {:>12} {:>13} {:>12} {:>12} {:>12}",
            "policy",
            "slo_jobs",
            "R_slo_violat",
            "attainment",
            "misses",
            "unreachable",
            "R_slo_reach",
            "susp_per_slo",
            "be_avg_jct_h",
            "round_avg_ms",
            "round_max_ms"
        );
        for r in rows {
            let _ = writeln!(
                s,
                "{:<14} {:>8} {:>12.2}% {:>10.2}% {:>7} {:>11} {:>11.2}% {:>13.2} {:>12.3} {:>12.1} {:>12.1}",
                r.policy,
                r.slo_jobs,
                100.0 * r.slo_violation,
                100.0 * r.slo_attainment,
                r.deadline_misses,
                r.slo_unreachable,
                100.0 * r.slo_violation_reachable,
                r.slo_suspensions,
                r.be_avg_jct_h,
                r.round_mean_ms,
                r.round_max_ms
            );
        }
    }
    s
}

pub fn to_json(rows: &[Summary]) -> serde_json::Value {
    json!(
        rows.iter()
            .map(|r| json!({
                "policy": r.policy, "jobs": r.jobs,
                "avg_jct_h": r.avg_jct_h, "p50_jct_h": r.p50_jct_h, "p99_jct_h": r.p99_jct_h,
                "makespan_h": r.makespan_h, "gpu_utilisation": r.utilisation,
                "restarts": r.restarts, "merges_temporal": r.merges_temporal, "merges_spatial": r.merges_spatial, "warm_starts": r.warm_starts,
                "guard_splits": r.guard_splits, "merges_released": r.merges_released, "ftf_mean": r.ftf_mean, "ftf_max": r.ftf_max,
                "rounds": r.rounds, "solver_fallbacks": r.fallbacks,
                "round_mean_ms": r.round_mean_ms, "round_p99_ms": r.round_p99_ms, "round_max_ms": r.round_max_ms,
                "wall_s": r.wall_s,
                "slo_jobs": r.slo_jobs, "slo_violation": r.slo_violation,
                "slo_attainment": r.slo_attainment, "deadline_misses": r.deadline_misses,
                "slo_unreachable": r.slo_unreachable, "slo_violation_reachable": r.slo_violation_reachable,
                "slo_suspensions": r.slo_suspensions, "be_avg_jct_h": r.be_avg_jct_h,
            }))
            .collect::<Vec<_>>()
    )
}

/// One row per job.
pub fn jobs_csv(r: &SimResult) -> String {
    let mut s = String::from(
        "policy,name,model,task,submit_s,first_start_s,finish_s,jct_s,ftf,restarts,merge_mode,merged_with,gpu_types,slo,deadline_s,reward\n",
    );
    for j in &r.jobs {
        let (mode, with) = j
            .merged
            .as_ref()
            .map_or(("", ""), |(m, w)| (m.as_str(), w.as_str()));
        let _ = writeln!(
            s,
            "{},{},{},{},{:.1},{},{:.1},{:.1},{:.3},{},{},{},{},{},{},{}",
            r.policy,
            j.name,
            j.model,
            j.task,
            j.submit_s,
            j.first_start_s
                .map(|t| format!("{t:.1}"))
                .unwrap_or_default(),
            j.finish_s,
            j.jct_s,
            j.ftf,
            j.restarts,
            mode,
            with,
            j.gpu_types.join("+"),
            j.class.as_str(),
            j.deadlines
                .first()
                .map(|d| format!("{:.1}", d.by))
                .unwrap_or_default(),
            j.reward().map(|w| format!("{w:.0}")).unwrap_or_default(),
        );
    }
    s
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// The empirical CDF of JCT per policy (log-scaled hours), as SVG.
pub fn svg_cdf(results: &[SimResult]) -> String {
    let (w, h, left, bottom, top, right) = (720.0, 440.0, 60.0, 50.0, 20.0, 160.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let all: Vec<f64> = results
        .iter()
        .flat_map(|r| r.jobs.iter().map(|j| (j.jct_s / 3600.0).max(1e-3)))
        .filter(|x| x.is_finite())
        .collect();
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1e-3)
        .log10()
        .floor();
    let hi = all
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .max(1e-2)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let x = |v: f64| left + pw * ((v.max(1e-3).log10() - lo) / (hi - lo));
    let y = |p: f64| top + ph * (1.0 - p);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<rect x=\"{left}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"black\"/>"
    );
    for d in (lo as i32)..=(hi as i32) {
        let v = 10f64.powi(d);
        let _ = writeln!(
            s,
            "<line x1=\"{0:.1}\" y1=\"{1}\" x2=\"{0:.1}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0:.1}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>",
            x(v),
            top,
            top + ph,
            top + ph + 16.0,
            if d >= 0 {
                format!("{}", v as u64)
            } else {
                format!("{v}")
            }
        );
    }
    for k in 0..=4 {
        let p = f64::from(k) / 4.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{p:.2}</text>",
            left - 6.0,
            y(p) + 4.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">JCT (hours, log scale)</text>",
        left + pw / 2.0,
        h - 10.0
    );
    let _ = writeln!(
        s,
        "<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">fraction of jobs</text>",
        top + ph / 2.0,
        top + ph / 2.0
    );
    for (k, r) in results.iter().enumerate() {
        let mut v: Vec<f64> = r
            .jobs
            .iter()
            .map(|j| j.jct_s / 3600.0)
            .filter(|x| x.is_finite())
            .collect();
        v.sort_by(f64::total_cmp);
        let n = v.len().max(1) as f64;
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, &t)| format!("{:.1},{:.1}", x(t), y((i + 1) as f64 / n)))
            .collect();
        let c = COLOURS[k % COLOURS.len()];
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        let ly = top + 16.0 + 18.0 * k as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{0}\" y1=\"{ly}\" x2=\"{1}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"/><text x=\"{2}\" y=\"{3}\">{4}</text>",
            left + pw + 12.0,
            left + pw + 32.0,
            left + pw + 38.0,
            ly + 4.0,
            r.policy
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_hand() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}

/// Lyra's figures of a run (thesis 002 Table 3.5 and Fig. 3.12).
#[derive(Clone, Debug, PartialEq)]
pub struct LyraSummary {
    /// Queuing (submission to its first training, profiling included),
    /// minutes: mean, median, p95.
    pub queue_min: [f64; 3],
    /// JCT, hours: mean, median, p95.
    pub jct_h: [f64; 3],
    /// Preemptions by reclaims over the jobs of the workload (Table 3.5's
    /// preemption ratio).
    pub preemption_ratio: f64,
    /// GPUs freed beyond the demand per reclaim (collateral damage).
    pub collateral_per_reclaim: f64,
    /// Share of the loaned GPU-seconds that training used.
    pub loaned_usage: f64,
    /// Reclaim decision time, milliseconds: mean and max.
    pub reclaim_ms: [f64; 2],
}

pub fn lyra_summary(r: &SimResult) -> LyraSummary {
    let three = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        [mean(&v), percentile(&v, 50.0), percentile(&v, 95.0)]
    };
    let queue = three(
        r.jobs
            .iter()
            .map(|j| (j.first_train_s.unwrap_or(j.finish_s) - j.submit_s).max(0.0) / 60.0)
            .collect(),
    );
    let jct = three(r.jobs.iter().map(|j| j.jct_s / 3600.0).collect());
    let l = &r.loans;
    let ms: Vec<f64> = l.reclaim_wall_s.iter().map(|s| s * 1000.0).collect();
    LyraSummary {
        queue_min: queue,
        jct_h: jct,
        preemption_ratio: f64::from(l.preemptions) / r.jobs.len().max(1) as f64,
        collateral_per_reclaim: if l.reclaim_ops > 0 {
            f64::from(l.collateral_gpus) / f64::from(l.reclaim_ops)
        } else {
            0.0
        },
        loaned_usage: if l.loaned_gpu_s > 0.0 {
            l.loaned_busy_gpu_s / l.loaned_gpu_s
        } else {
            0.0
        },
        reclaim_ms: [mean(&ms), ms.iter().copied().fold(0.0, f64::max)],
    }
}

/// `fmsim lyra`'s table: one row per scenario, with the baseline's (first
/// row's) mean queuing time and JCT over each row's.
pub fn lyra_table(labels: &[&str], results: &[SimResult]) -> String {
    use std::fmt::Write as _;
    let rows: Vec<LyraSummary> = results.iter().map(lyra_summary).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<26} {:>24} {:>20} {:>9} {:>8} {:>10} {:>9} {:>12} {:>9} {:>8} {:>8} {:>12}",
        "scenario",
        "queue min mean/p50/p95",
        "jct h mean/p50/p95",
        "util",
        "preempt",
        "scale-ins",
        "collat.",
        "opt. preempt",
        "loan use",
        "base/q",
        "base/jct",
        "reclaim ms"
    );
    let base = rows.first().cloned();
    for ((label, r), s) in labels.iter().zip(results).zip(&rows) {
        let l = &r.loans;
        let (bq, bj) = base.as_ref().map_or((f64::NAN, f64::NAN), |b| {
            (b.queue_min[0] / s.queue_min[0], b.jct_h[0] / s.jct_h[0])
        });
        let searched = if l.searched_reclaims > 0 {
            format!(
                "{}/{}",
                l.searched_preemptions, l.searched_optimal_preemptions
            )
        } else {
            "-".into()
        };
        let _ = writeln!(
            out,
            "{:<26} {:>24} {:>20} {:>8.1}% {:>7.1}% {:>10} {:>9.1} {:>12} {:>8.1}% {:>7.2}x {:>7.2}x {:>12}",
            label,
            format!(
                "{:.1}/{:.1}/{:.1}",
                s.queue_min[0], s.queue_min[1], s.queue_min[2]
            ),
            format!("{:.2}/{:.2}/{:.2}", s.jct_h[0], s.jct_h[1], s.jct_h[2]),
            100.0 * r.gpu_utilisation,
            100.0 * s.preemption_ratio,
            l.scale_ins,
            s.collateral_per_reclaim,
            searched,
            100.0 * s.loaned_usage,
            bq,
            bj,
            if l.reclaim_ops > 0 {
                format!("{:.3}/{:.3}", s.reclaim_ms[0], s.reclaim_ms[1])
            } else {
                "-".into()
            }
        );
    }
    out
}
