//! Fake GPU backend: simulated GPUs whose telemetry follows the load placed
//! on them. Used where no NVIDIA driver exists (tests, demos, compose).
//!
//! Each process attached to a GPU (by the agent's process driver) adds its
//! memory and utilisation; processes whose pid has exited are dropped at the
//! next sample, as NVML would stop listing them. Power follows utilisation
//! between the model's idle and board power; temperature approaches a
//! utilisation-dependent target with a thermal time constant, so it rises
//! and falls gradually like a real card.

use std::sync::Mutex;
use std::time::Instant;

use fmsched_proto::v1 as pb;

use super::GpuBackend;

/// Published figures of the GPU models the fake backend can imitate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FakeModel {
    pub name: &'static str,
    pub memory_bytes: u64,
    pub idle_watts: f64,
    pub board_watts: f64,
}

const GIB: u64 = 1 << 30;

/// Memory and board power from NVIDIA's data sheets; idle power is typical.
pub const MODELS: &[FakeModel] = &[
    FakeModel {
        name: "A100-80GB",
        memory_bytes: 80 * GIB,
        idle_watts: 60.0,
        board_watts: 400.0,
    },
    FakeModel {
        name: "A100-40GB",
        memory_bytes: 40 * GIB,
        idle_watts: 55.0,
        board_watts: 400.0,
    },
    FakeModel {
        name: "H100-80GB",
        memory_bytes: 80 * GIB,
        idle_watts: 70.0,
        board_watts: 700.0,
    },
    FakeModel {
        name: "H200-141GB",
        memory_bytes: 141 * GIB,
        idle_watts: 75.0,
        board_watts: 700.0,
    },
    FakeModel {
        name: "V100-32GB",
        memory_bytes: 32 * GIB,
        idle_watts: 40.0,
        board_watts: 300.0,
    },
    FakeModel {
        name: "V100-16GB",
        memory_bytes: 16 * GIB,
        idle_watts: 40.0,
        board_watts: 300.0,
    },
    FakeModel {
        name: "A10-24GB",
        memory_bytes: 24 * GIB,
        idle_watts: 20.0,
        board_watts: 150.0,
    },
    FakeModel {
        name: "L4-24GB",
        memory_bytes: 24 * GIB,
        idle_watts: 16.0,
        board_watts: 72.0,
    },
];

/// Ambient temperature and the thermal time constant of the model.
const AMBIENT_C: f64 = 32.0;
const FULL_LOAD_RISE_C: f64 = 45.0;
const THERMAL_TAU_S: f64 = 20.0;

/// A process placed on a fake GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeLoad {
    pub pid: u32,
    pub gpu_index: u32,
    pub memory_bytes: u64,
    /// Utilisation the process drives (0–100).
    pub utilization: u32,
}

#[derive(Debug)]
struct State {
    loads: Vec<FakeLoad>,
    temperature: Vec<f64>,
    last: Instant,
    rng: u64,
}

/// Simulated GPUs (see the module docs).
#[derive(Debug)]
pub struct FakeGpuBackend {
    model: FakeModel,
    /// GPU indices that report hardware errors (`FMSCHED_FAKE_XID_GPUS`).
    faulty: Vec<u32>,
    uuids: Vec<String>,
    state: Mutex<State>,
    /// Checks whether a pid is alive (replaceable in tests).
    alive: fn(u32) -> bool,
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl FakeGpuBackend {
    /// `count` GPUs of `model` on node `node_id`. UUIDs are derived from the
    /// node id so they are stable across agent restarts and unique per node.
    pub fn new(node_id: &str, count: u32, model: &str) -> Result<Self, String> {
        if count == 0 || count > 16 {
            return Err(format!("--fake-gpus must be 1-16, got {count}"));
        }
        let m = MODELS
            .iter()
            .find(|m| m.name.eq_ignore_ascii_case(model))
            .copied()
            .ok_or_else(|| {
                let names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
                format!(
                    "unknown fake GPU model {model:?}; choose one of {}",
                    names.join(", ")
                )
            })?;
        let h = fmsched_core::hash::fnv1a(node_id.as_bytes());
        let uuids = (0..count)
            .map(|i| {
                format!(
                    "GPU-fake{:08x}-{:04x}-4000-8000-{:012x}",
                    h as u32,
                    i,
                    (h >> 16) & 0xffff_ffff_ffff
                )
            })
            .collect();
        // Test knob: GPUs (by index) that report an Xid error and an
        // uncorrectable ECC error, to exercise draining a faulty node.
        let faulty = std::env::var("FMSCHED_FAKE_XID_GPUS")
            .ok()
            .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_default();
        Ok(Self {
            model: m,
            faulty,
            uuids,
            state: Mutex::new(State {
                loads: Vec::new(),
                temperature: vec![AMBIENT_C; count as usize],
                last: Instant::now(),
                rng: h | 1,
            }),
            alive: pid_alive,
        })
    }

    #[cfg(test)]
    fn with_liveness(mut self, alive: fn(u32) -> bool) -> Self {
        self.alive = alive;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Places a process on a GPU (replacing an earlier entry of the same pid and GPU).
    pub fn attach(&self, load: FakeLoad) {
        let mut st = self.lock();
        st.loads
            .retain(|l| !(l.pid == load.pid && l.gpu_index == load.gpu_index));
        st.loads.push(load);
    }

    /// Removes every load of `pid`.
    pub fn detach(&self, pid: u32) {
        self.lock().loads.retain(|l| l.pid != pid);
    }

    pub fn model(&self) -> FakeModel {
        self.model
    }
}

fn xorshift(s: &mut u64) -> f64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    (*s >> 11) as f64 / (1u64 << 53) as f64
}

impl GpuBackend for FakeGpuBackend {
    fn process_started(&self, pid: u32, gpu_indices: &[u32], expected_utilization_pct: u32) {
        // A training process keeps its GPUs as busy as the scheduler
        // expects (90 % when it does not say) and holds most of their
        // memory alone, a share of it beside another process.
        for &g in gpu_indices {
            let util = match expected_utilization_pct {
                0 => 90,
                u => u.min(100),
            };
            let memory = if expected_utilization_pct > 0 {
                self.model.memory_bytes * u64::from(util) / 200
            } else {
                self.model.memory_bytes * 6 / 10
            };
            self.attach(FakeLoad {
                pid,
                gpu_index: g,
                memory_bytes: memory,
                utilization: util,
            });
        }
    }

    fn process_stopped(&self, pid: u32) {
        self.detach(pid);
    }

    fn kind(&self) -> &'static str {
        "fake"
    }

    fn inventory(&self) -> Vec<pb::GpuInfo> {
        self.uuids
            .iter()
            .enumerate()
            .map(|(i, uuid)| pb::GpuInfo {
                uuid: uuid.clone(),
                index: i as u32,
                model: self.model.name.to_string(),
                memory_total_bytes: self.model.memory_bytes,
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
            })
            .collect()
    }

    fn sample(&self) -> Vec<pb::GpuTelemetry> {
        let alive = self.alive;
        let mut st = self.lock();
        st.loads.retain(|l| alive(l.pid));
        let now = Instant::now();
        let dt = now.duration_since(st.last).as_secs_f64();
        st.last = now;
        let decay = 1.0 - (-dt / THERMAL_TAU_S).exp();
        let m = self.model;
        let mut out = Vec::with_capacity(self.uuids.len());
        for (i, uuid) in self.uuids.iter().enumerate() {
            let on_gpu: Vec<&FakeLoad> = st
                .loads
                .iter()
                .filter(|l| l.gpu_index == i as u32)
                .collect();
            let demand: u32 = on_gpu.iter().map(|l| l.utilization).sum();
            let memory: u64 = on_gpu
                .iter()
                .map(|l| l.memory_bytes)
                .sum::<u64>()
                .min(m.memory_bytes);
            // Processes that want more than the GPU has get it in
            // proportion to what they want.
            let scale = 100.0 / f64::from(demand.max(100));
            let processes: Vec<pb::GpuProcess> = on_gpu
                .iter()
                .map(|l| pb::GpuProcess {
                    pid: l.pid,
                    used_memory_bytes: l.memory_bytes,
                    utilization_percent: (f64::from(l.utilization) * scale).round() as u32,
                })
                .collect();
            let noise = xorshift(&mut st.rng) * 2.0 - 1.0;
            let util = if demand == 0 {
                0.0
            } else {
                (f64::from(demand.min(100)) + 2.0 * noise).clamp(1.0, 100.0)
            };
            let target = AMBIENT_C + FULL_LOAD_RISE_C * util / 100.0;
            let t = st.temperature[i] + (target - st.temperature[i]) * decay;
            st.temperature[i] = t;
            let power = m.idle_watts + (m.board_watts - m.idle_watts) * util / 100.0 + noise;
            out.push(pb::GpuTelemetry {
                uuid: uuid.clone(),
                utilization_percent: util.round() as u32,
                memory_used_bytes: memory,
                memory_total_bytes: m.memory_bytes,
                temperature_celsius: t.round() as u32,
                power_watts: power.max(0.0),
                ecc_corrected_errors: 0,
                ecc_uncorrected_errors: u64::from(self.faulty.contains(&(i as u32))),
                xid_errors: u64::from(self.faulty.contains(&(i as u32))),
                processes,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn inventory_is_stable_and_unique_per_node() {
        let a = FakeGpuBackend::new("node-a", 4, "A100-80GB").unwrap();
        let a2 = FakeGpuBackend::new("node-a", 4, "a100-80gb").unwrap();
        let b = FakeGpuBackend::new("node-b", 4, "A100-80GB").unwrap();
        let ua: Vec<_> = a.inventory().into_iter().map(|g| g.uuid).collect();
        assert_eq!(
            ua,
            a2.inventory()
                .into_iter()
                .map(|g| g.uuid)
                .collect::<Vec<_>>()
        );
        let ub: Vec<_> = b.inventory().into_iter().map(|g| g.uuid).collect();
        assert!(ua.iter().all(|u| !ub.contains(u)));
        assert_eq!(a.inventory()[3].memory_total_bytes, 80 * GIB);
        assert!(
            FakeGpuBackend::new("n", 2, "TPUv9")
                .unwrap_err()
                .contains("A100-80GB")
        );
        assert!(FakeGpuBackend::new("n", 0, "A100-80GB").is_err());
    }

    #[test]
    fn telemetry_follows_load() {
        let g = FakeGpuBackend::new("n", 2, "A100-80GB")
            .unwrap()
            .with_liveness(|pid| pid != 999);
        let idle = g.sample();
        assert_eq!(idle[0].utilization_percent, 0);
        assert_eq!(idle[0].memory_used_bytes, 0);
        assert!(idle[0].power_watts < 70.0);

        g.attach(FakeLoad {
            pid: 42,
            gpu_index: 0,
            memory_bytes: 30 * GIB,
            utilization: 95,
        });
        g.attach(FakeLoad {
            pid: 999,
            gpu_index: 1,
            memory_bytes: 10 * GIB,
            utilization: 50,
        });
        // Let some simulated time pass so the temperature moves.
        g.lock().last -= Duration::from_secs(30);
        let busy = g.sample();
        assert!(busy[0].utilization_percent >= 90, "{:?}", busy[0]);
        assert_eq!(busy[0].memory_used_bytes, 30 * GIB);
        assert_eq!(busy[0].processes.len(), 1);
        assert_eq!(busy[0].processes[0].pid, 42);
        assert!(busy[0].power_watts > 350.0, "{}", busy[0].power_watts);
        assert!(busy[0].temperature_celsius > idle[0].temperature_celsius + 20);
        // pid 999 is not alive: dropped, GPU 1 idle.
        assert_eq!(busy[1].utilization_percent, 0);
        assert!(busy[1].processes.is_empty());

        g.detach(42);
        g.lock().last -= Duration::from_secs(120);
        let cooled = g.sample();
        assert_eq!(cooled[0].utilization_percent, 0);
        assert!(cooled[0].temperature_celsius < busy[0].temperature_celsius);
    }

    /// Two processes on one GPU (ICEFROG sharing): each loads it as the
    /// scheduler expects and reports its own utilisation; wanting more
    /// than the GPU has saturates it and each gets its proportional share.
    #[test]
    fn sharers_report_their_own_utilisation_and_saturate_together() {
        let g = FakeGpuBackend::new("n", 1, "A100-80GB")
            .unwrap()
            .with_liveness(|_| true);
        g.process_started(1, &[0], 30);
        g.process_started(2, &[0], 40);
        let s = g.sample();
        let util: Vec<u32> = s[0]
            .processes
            .iter()
            .map(|p| p.utilization_percent)
            .collect();
        assert_eq!(util, vec![30, 40]);
        assert!((68..=72).contains(&s[0].utilization_percent), "{:?}", s[0]);
        g.process_started(3, &[0], 60);
        let s = g.sample();
        assert!(s[0].utilization_percent >= 98, "saturated: {:?}", s[0]);
        let util: Vec<u32> = s[0]
            .processes
            .iter()
            .map(|p| p.utilization_percent)
            .collect();
        assert_eq!(util, vec![23, 31, 46], "shares of 130 % wanted");
        // Without a hint a process takes 90 %, as before.
        let h = FakeGpuBackend::new("m", 1, "A100-80GB")
            .unwrap()
            .with_liveness(|_| true);
        h.process_started(9, &[0], 0);
        assert_eq!(h.sample()[0].processes[0].utilization_percent, 90);
    }
}
