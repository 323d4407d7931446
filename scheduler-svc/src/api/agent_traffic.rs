//! What an agent's session may send, beyond the shape checks of
//! `agents::validate_*`: telemetry within physical bounds, and messages at
//! a rate no agent needs to exceed. A broken sensor, a driver bug or a
//! hostile process with a stolen credential must not feed `u64::MAX`
//! bytes, 4e9 % utilisation or `+inf` watts into the utilisation fits,
//! `fmctl nodes` and the metrics, nor flood the leader.

use fmsched_proto::v1 as pb;

/// Physical bounds of one GPU's telemetry: generous for any GPU made (an
/// H200 has 141 GB and draws 700 W; no GPU runs above ~110 °C).
pub mod bounds {
    /// Memory per GPU (16 TiB).
    pub const MEMORY_BYTES: u64 = 16 << 40;
    /// Percent.
    pub const UTILIZATION: u32 = 100;
    /// Degrees Celsius.
    pub const TEMPERATURE_C: u32 = 150;
    /// Watts (a whole 8-GPU board draws ~10 kW).
    pub const POWER_W: f64 = 10_000.0;
    /// Error counters are stored as Postgres BIGINT.
    pub const COUNTER: u64 = i64::MAX as u64;
}

/// Clamps each GPU's telemetry into [`bounds`]: a value outside them is
/// read as unknown (0; memory used: at most the total) and counted.
/// Returns how many values it replaced.
pub fn clamp_telemetry(gpus: &mut [pb::GpuTelemetry]) -> u64 {
    let mut replaced = 0;
    let mut fix = |out_of_range: bool| {
        replaced += u64::from(out_of_range);
        out_of_range
    };
    for g in gpus {
        if fix(g.utilization_percent > bounds::UTILIZATION) {
            g.utilization_percent = 0;
        }
        if fix(g.memory_total_bytes > bounds::MEMORY_BYTES) {
            g.memory_total_bytes = 0;
        }
        // Used memory within the total (within the bound where the total
        // is unknown).
        let cap = if g.memory_total_bytes > 0 {
            g.memory_total_bytes
        } else {
            bounds::MEMORY_BYTES
        };
        if fix(g.memory_used_bytes > cap) {
            g.memory_used_bytes = g.memory_total_bytes;
        }
        if fix(g.temperature_celsius > bounds::TEMPERATURE_C) {
            g.temperature_celsius = 0;
        }
        if fix(!(g.power_watts.is_finite() && (0.0..=bounds::POWER_W).contains(&g.power_watts))) {
            g.power_watts = 0.0;
        }
        for c in [
            &mut g.ecc_corrected_errors,
            &mut g.ecc_uncorrected_errors,
            &mut g.xid_errors,
        ] {
            if fix(*c > bounds::COUNTER) {
                *c = bounds::COUNTER;
            }
        }
    }
    replaced
}

/// A session's message budget: a token bucket of `burst` messages that
/// refills at `per_second`. An agent sends a heartbeat per interval, a
/// status per task change and a log chunk per request: far below the
/// defaults of [`MessageBudget::for_agents`].
#[derive(Debug)]
pub struct MessageBudget {
    tokens: f64,
    burst: f64,
    per_second: f64,
    last: std::time::Instant,
}

impl MessageBudget {
    pub fn new(burst: f64, per_second: f64, now: std::time::Instant) -> Self {
        Self {
            tokens: burst,
            burst,
            per_second,
            last: now,
        }
    }

    /// 1,000 messages at once, 200 a second after.
    pub fn for_agents(now: std::time::Instant) -> Self {
        Self::new(1000.0, 200.0, now)
    }

    /// Takes one message from the budget at `now`; false when it is spent.
    pub fn take(&mut self, now: std::time::Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn impossible_telemetry_is_read_as_unknown_and_counted() {
        let sane = pb::GpuTelemetry {
            uuid: "GPU-0".into(),
            utilization_percent: 87,
            memory_used_bytes: 40 << 30,
            memory_total_bytes: 80 << 30,
            temperature_celsius: 61,
            power_watts: 412.5,
            ecc_corrected_errors: 3,
            ..Default::default()
        };
        let mut gpus = vec![sane.clone()];
        assert_eq!(clamp_telemetry(&mut gpus), 0);
        assert_eq!(gpus[0], sane);
        let mut gpus = vec![pb::GpuTelemetry {
            uuid: "GPU-1".into(),
            utilization_percent: u32::MAX,
            memory_used_bytes: u64::MAX,
            memory_total_bytes: u64::MAX,
            temperature_celsius: 4_000_000_000,
            power_watts: f64::INFINITY,
            xid_errors: u64::MAX,
            ..Default::default()
        }];
        assert_eq!(clamp_telemetry(&mut gpus), 6);
        let g = &gpus[0];
        assert_eq!(
            (
                g.utilization_percent,
                g.memory_used_bytes,
                g.memory_total_bytes,
                g.temperature_celsius
            ),
            (0, 0, 0, 0)
        );
        assert_eq!(g.power_watts, 0.0);
        assert_eq!(g.xid_errors, i64::MAX as u64);
        let mut nan = vec![pb::GpuTelemetry {
            power_watts: f64::NAN,
            memory_used_bytes: 90 << 30,
            memory_total_bytes: 80 << 30,
            ..Default::default()
        }];
        assert_eq!(clamp_telemetry(&mut nan), 2);
        assert_eq!(nan[0].memory_used_bytes, 80 << 30, "at most the total");
    }

    #[test]
    fn a_flood_spends_the_budget_and_time_refills_it() {
        let t0 = Instant::now();
        let mut b = MessageBudget::new(10.0, 5.0, t0);
        assert_eq!((0..20).filter(|_| b.take(t0)).count(), 10);
        assert!(!b.take(t0));
        assert!(b.take(t0 + Duration::from_millis(200)), "one back in 0.2 s");
        assert!(!b.take(t0 + Duration::from_millis(200)));
        // A long pause refills to the burst, no more.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..20).filter(|_| b.take(later)).count(), 10);
    }
}
