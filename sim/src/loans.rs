//! Capacity loaned from an inference cluster (Lyra, thesis 002 §3.4): the
//! inference side's utilisation over time, how many of its servers it can
//! lend, and what the simulator counts about loans and reclaims.
//!
//! Every `every_s` (the orchestrator's five minutes, §3.7.1) the inference
//! side needs `⌈u · N⌉` of its `N` servers, where `u` is the highest
//! utilisation of its trace over the next interval (Lyra predicts the next
//! five minutes with an LSTM; the simulator reads the trace ahead, a
//! perfect predictor), and keeps a headroom of `⌈h · N⌉` servers never
//! loaned (2 % by default, §3.7.1). The rest may be on loan to training:
//! more are loaned when that number grows, and the difference is reclaimed
//! by [`fmsched_core::policy::lyra::reclaim`] when it shrinks.

use fmsched_core::policy::lyra::ReclaimRule;

use crate::cluster::NodeGroup;

/// The inference side of a simulation.
#[derive(Clone, Debug)]
pub struct Loans {
    /// Inference servers (after the training cluster's nodes).
    pub inference: Vec<NodeGroup>,
    pub trace: InferenceTrace,
    /// Share of the inference servers never loaned.
    pub headroom: f64,
    /// Seconds between the orchestrator's decisions.
    pub every_s: f64,
    /// How a reclaim picks the servers it returns.
    pub rule: ReclaimRule,
}

impl Loans {
    /// Inference servers the orchestrator may lend at `t`, of `servers`.
    pub fn loanable(&self, servers: usize, t: f64) -> usize {
        let u = self.trace.max_over(t, t + self.every_s).clamp(0.0, 1.0);
        let n = servers as f64;
        let busy = (u * n - 1e-9).ceil().max(0.0) as usize;
        let keep = (self.headroom * n - 1e-9).ceil().max(0.0) as usize;
        servers.saturating_sub(busy + keep)
    }
}

/// Inference utilisation over time: the share of the inference cluster's
/// GPUs its own work needs, as steps `(t_s, share)` from the workload's
/// start, repeated every `period_s` (0: the last value holds).
#[derive(Clone, Debug, PartialEq)]
pub struct InferenceTrace {
    pub points: Vec<(f64, f64)>,
    pub period_s: f64,
}

impl InferenceTrace {
    /// A daily sine with this mean and peak-to-trough ratio, in steps of
    /// `step_s` (the thesis' inference cluster: 65 % on average, 2.2× from
    /// trough to peak, §3.2.1), its trough at midnight.
    pub fn diurnal(mean: f64, peak_to_trough: f64, step_s: f64) -> Self {
        // peak / trough = (1 + a) / (1 − a)  ⇒  a = (r − 1) / (r + 1).
        let r = peak_to_trough.max(1.0);
        let a = (r - 1.0) / (r + 1.0);
        let day = 86_400.0;
        let steps = (day / step_s.max(1.0)).round().max(1.0) as usize;
        let points = (0..steps)
            .map(|k| {
                let t = k as f64 * day / steps as f64;
                let phase = 2.0 * std::f64::consts::PI * t / day;
                (t, (mean * (1.0 - a * phase.cos())).clamp(0.0, 1.0))
            })
            .collect();
        Self {
            points,
            period_s: day,
        }
    }

    /// A CSV of `t_s,utilisation` rows (a header line is skipped; the
    /// utilisation a share in [0, 1] or a percentage above 1), times
    /// ascending; it repeats over its span rounded up to a whole day.
    pub fn from_csv(text: &str) -> Result<Self, String> {
        let mut points: Vec<(f64, f64)> = Vec::new();
        for (k, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut cols = line.split(',').map(str::trim);
            let (Some(t), Some(u)) = (cols.next(), cols.next()) else {
                return Err(format!("line {}: expected t_s,utilisation", k + 1));
            };
            let (Ok(t), Ok(u)) = (t.parse::<f64>(), u.parse::<f64>()) else {
                if points.is_empty() && k == 0 {
                    continue; // the header
                }
                return Err(format!("line {}: {line:?} is not two numbers", k + 1));
            };
            let u = if u > 1.0 { u / 100.0 } else { u };
            if !(t.is_finite() && (0.0..=1.0).contains(&u)) {
                return Err(format!(
                    "line {}: utilisation {u} outside [0, 1] or time {t} not finite",
                    k + 1
                ));
            }
            if points.last().is_some_and(|p| p.0 >= t) {
                return Err(format!("line {}: times must ascend", k + 1));
            }
            points.push((t, u));
        }
        let Some(&(last, _)) = points.last() else {
            return Err("the inference trace has no rows".into());
        };
        let day = 86_400.0;
        Ok(Self {
            period_s: ((last + 1.0) / day).ceil().max(1.0) * day,
            points,
        })
    }

    /// The share at time `t`.
    pub fn at(&self, t: f64) -> f64 {
        let t = if self.period_s > 0.0 {
            t.rem_euclid(self.period_s)
        } else {
            t
        };
        match self.points.iter().rposition(|p| p.0 <= t) {
            Some(k) => self.points[k].1,
            None => self.points.last().map_or(0.0, |p| p.1),
        }
    }

    /// The highest share over `[t0, t1]`.
    pub fn max_over(&self, t0: f64, t1: f64) -> f64 {
        let mut m = self.at(t0);
        let Some(period) = Some(self.period_s).filter(|&p| p > 0.0) else {
            return self
                .points
                .iter()
                .filter(|p| p.0 > t0 && p.0 <= t1)
                .map(|p| p.1)
                .fold(m, f64::max);
        };
        let start = (t0 / period).floor() * period;
        let mut base = start;
        while base <= t1 {
            for p in &self.points {
                let t = base + p.0;
                if t > t0 && t <= t1 {
                    m = m.max(p.1);
                }
            }
            base += period;
        }
        m
    }
}

/// What a simulation with loans counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoanStats {
    /// Orchestrator decisions that loaned servers, and the servers.
    pub loan_ops: u32,
    pub servers_loaned: u32,
    /// Reclaims, the servers they returned.
    pub reclaim_ops: u32,
    pub servers_reclaimed: u32,
    /// Jobs preempted by reclaims (each time), and jobs that only scaled in.
    pub preemptions: u32,
    pub scale_ins: u32,
    /// GPUs the preemptions freed on servers that were not returned.
    pub collateral_gpus: u32,
    /// Wall-clock seconds of each reclaim decision.
    pub reclaim_wall_s: Vec<f64>,
    /// Preemptions the exhaustive search would have made, summed over the
    /// reclaims small enough to search (at most 16 loaned servers), and
    /// those reclaims' own preemptions, for the comparison.
    pub searched_reclaims: u32,
    pub searched_preemptions: u32,
    pub searched_optimal_preemptions: u32,
    /// GPU-seconds of loaned servers, and of their GPUs training used.
    pub loaned_gpu_s: f64,
    pub loaned_busy_gpu_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lyra_diurnal_trace_has_its_mean_and_ratio() {
        let t = InferenceTrace::diurnal(0.65, 2.2, 300.0);
        let vals: Vec<f64> = t.points.iter().map(|p| p.1).collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let (lo, hi) = vals
            .iter()
            .fold((1.0f64, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
        assert!((mean - 0.65).abs() < 1e-3, "{mean}");
        assert!((hi / lo - 2.2).abs() < 0.01, "{}", hi / lo);
        // Trough at midnight, peak at noon, every day alike.
        assert_eq!(t.at(0.0), lo);
        assert!((t.at(43_200.0) - hi).abs() < 1e-9);
        assert_eq!(t.at(86_400.0 + 3_600.0), t.at(3_600.0));
        assert!(t.max_over(0.0, 43_200.0) >= t.at(43_000.0));
    }

    #[test]
    fn lyra_loanable_servers_leave_the_headroom_and_what_inference_needs() {
        let loans = Loans {
            inference: vec![NodeGroup::new("V100", 50, 8)],
            trace: InferenceTrace {
                points: vec![(0.0, 0.5), (600.0, 0.9)],
                period_s: 0.0,
            },
            headroom: 0.02,
            every_s: 300.0,
            rule: ReclaimRule::Lyra,
        };
        // 25 servers busy, 1 headroom: 24 to lend.
        assert_eq!(loans.loanable(50, 0.0), 24);
        // Looking ahead: at 400 s the next five minutes reach 90 %.
        assert_eq!(loans.loanable(50, 400.0), 4);
    }

    #[test]
    fn lyra_trace_csv_reads_shares_and_percentages_and_names_bad_lines() {
        let t = InferenceTrace::from_csv("t_s,utilisation\n0,40\n3600,0.8\n").unwrap();
        assert_eq!(t.points, vec![(0.0, 0.4), (3600.0, 0.8)]);
        assert_eq!(t.period_s, 86_400.0);
        assert_eq!(t.at(7_200.0), 0.8);
        let e = InferenceTrace::from_csv("0,0.5\n10,x\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = InferenceTrace::from_csv("0,0.5\n0,0.6\n").unwrap_err();
        assert!(e.contains("ascend"), "{e}");
    }
}
