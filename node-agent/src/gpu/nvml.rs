//! NVML backend: real GPUs through the NVIDIA driver (`libnvidia-ml.so`).
//!
//! Xid errors arrive as NVML events; a watcher thread counts them per GPU
//! (where the driver supports the event) so every heartbeat carries the
//! count seen since the agent started.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use fmsched_proto::v1 as pb;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use super::GpuBackend;

/// NVML is initialised once per process and lives for its whole life.
static NVML: OnceLock<Nvml> = OnceLock::new();

pub struct NvmlBackend {
    nvml: &'static Nvml,
    inventory: Vec<pb::GpuInfo>,
    xid: Arc<Vec<AtomicU64>>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("gpus", &self.inventory.len())
            .finish()
    }
}

/// Explains an NVML start-up failure in terms an operator can act on.
fn explain(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => format!(
            "NVML is not available ({e}): the NVIDIA driver (libnvidia-ml.so) is not installed on this host. \
             On a host without NVIDIA GPUs, run the agent with --fake-gpus N to simulate them."
        ),
        NvmlError::DriverNotLoaded => {
            format!("NVML: the NVIDIA kernel driver is not loaded ({e}); check `nvidia-smi`.")
        }
        NvmlError::NoPermission => {
            format!("NVML: permission denied ({e}); the agent needs access to /dev/nvidia*.")
        }
        other => format!("NVML initialisation failed: {other}"),
    }
}

impl NvmlBackend {
    pub fn init() -> Result<Self, String> {
        let nvml = match NVML.get() {
            Some(n) => n,
            None => {
                let n = Nvml::init().map_err(|e| explain(&e))?;
                NVML.get_or_init(|| n)
            }
        };
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        if count == 0 {
            return Err("NVML reports no GPUs on this host".into());
        }
        let mut inventory = Vec::with_capacity(count as usize);
        for i in 0..count {
            let d = nvml
                .device_by_index(i)
                .map_err(|e| format!("NVML device {i}: {e}"))?;
            inventory.push(pb::GpuInfo {
                uuid: d.uuid().map_err(|e| format!("NVML device {i} uuid: {e}"))?,
                index: i,
                model: d.name().unwrap_or_else(|_| "unknown".into()),
                memory_total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
                pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
            });
        }
        let xid: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
        spawn_xid_watcher(nvml, count, xid.clone());
        Ok(Self {
            nvml,
            inventory,
            xid,
        })
    }
}

#[cfg(target_os = "linux")]
fn spawn_xid_watcher(nvml: &'static Nvml, count: u32, xid: Arc<Vec<AtomicU64>>) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "NVML event sets unsupported; Xid errors will not be counted");
            return;
        }
    };
    for i in 0..count {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        // Registering consumes the set, so only try where the driver says
        // the event is supported.
        let supported = d
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            tracing::warn!(gpu = i, "driver cannot report Xid events for this GPU");
            continue;
        }
        match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => set = s,
            Err(e) => {
                tracing::warn!(gpu = i, error = %e.error, "Xid watching disabled");
                return;
            }
        }
    }
    std::thread::Builder::new()
        .name("nvml-xid".into())
        .spawn(move || {
            loop {
                match set.wait(1000) {
                    Ok(ev) => {
                        if let Ok(i) = ev.device.index() {
                            if let Some(c) = xid.get(i as usize) {
                                c.fetch_add(1, Ordering::Relaxed);
                            }
                            tracing::error!(gpu = i, xid = ?ev.event_data, "GPU Xid error");
                        }
                    }
                    Err(NvmlError::Timeout) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "Xid watcher stopped");
                        return;
                    }
                }
            }
        })
        .ok();
}

#[cfg(not(target_os = "linux"))]
fn spawn_xid_watcher(_: &'static Nvml, _: u32, _: Arc<Vec<AtomicU64>>) {}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> Vec<pb::GpuInfo> {
        self.inventory.clone()
    }

    fn sample(&self) -> Vec<pb::GpuTelemetry> {
        self.inventory
            .iter()
            .map(|info| {
                let mut t = pb::GpuTelemetry {
                    uuid: info.uuid.clone(),
                    memory_total_bytes: info.memory_total_bytes,
                    xid_errors: self
                        .xid
                        .get(info.index as usize)
                        .map_or(0, |c| c.load(Ordering::Relaxed)),
                    ..Default::default()
                };
                let Ok(d) = self.nvml.device_by_index(info.index) else {
                    return t;
                };
                // Each query may be unsupported on some boards; report what works.
                if let Ok(u) = d.utilization_rates() {
                    t.utilization_percent = u.gpu;
                }
                if let Ok(m) = d.memory_info() {
                    t.memory_used_bytes = m.used;
                    t.memory_total_bytes = m.total;
                }
                if let Ok(c) = d.temperature(TemperatureSensor::Gpu) {
                    t.temperature_celsius = c;
                }
                if let Ok(mw) = d.power_usage() {
                    t.power_watts = f64::from(mw) / 1000.0;
                }
                t.ecc_corrected_errors = d
                    .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                    .unwrap_or(0);
                t.ecc_uncorrected_errors = d
                    .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                    .unwrap_or(0);
                if let Ok(procs) = d.running_compute_processes() {
                    // Each process's latest SM utilisation sample.
                    let mut sm: std::collections::BTreeMap<u32, (u64, u32)> = Default::default();
                    for s in d.process_utilization_stats(None).unwrap_or_default() {
                        let e = sm.entry(s.pid).or_insert((s.timestamp, s.sm_util));
                        if s.timestamp >= e.0 {
                            *e = (s.timestamp, s.sm_util);
                        }
                    }
                    t.processes = procs
                        .into_iter()
                        .map(|p| pb::GpuProcess {
                            pid: p.pid,
                            used_memory_bytes: match p.used_gpu_memory {
                                UsedGpuMemory::Used(b) => b,
                                UsedGpuMemory::Unavailable => 0,
                            },
                            utilization_percent: sm.get(&p.pid).map_or(0, |s| s.1),
                        })
                        .collect();
                }
                t
            })
            .collect()
    }
}
