//! The agent's `/metrics`: per-GPU gauges with DCGM-exporter names and
//! labels (so existing dashboards work), plus the process driver's counters.

use std::sync::Arc;

use fmsched_runtime::metrics::{Exposition, Kind};

use crate::gpu::GpuBackend;
use crate::reconcile::Reconciler;

/// Renders one scrape.
pub async fn render(node_id: &str, gpus: &Arc<dyn GpuBackend>, reconciler: &Reconciler) -> String {
    let inventory = gpus.inventory();
    let g = gpus.clone();
    let telemetry = tokio::task::spawn_blocking(move || g.sample())
        .await
        .unwrap_or_default();
    let mut e = Exposition::default();
    let families = [
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
        (
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Total number of single-bit volatile ECC errors.",
        ),
        (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Total number of double-bit volatile ECC errors.",
        ),
        (
            "DCGM_FI_DEV_XID_ERRORS",
            "Xid errors seen since the agent started.",
        ),
    ];
    for (name, help) in families {
        e.family(name, Kind::Gauge, help);
        for t in &telemetry {
            let Some(info) = inventory.iter().find(|i| i.uuid == t.uuid) else {
                continue;
            };
            let index = info.index.to_string();
            let labels = [
                ("gpu", index.as_str()),
                ("UUID", t.uuid.as_str()),
                ("modelName", info.model.as_str()),
                ("Hostname", node_id),
            ];
            const MIB: f64 = 1024.0 * 1024.0;
            let v = match name {
                "DCGM_FI_DEV_GPU_UTIL" => f64::from(t.utilization_percent),
                "DCGM_FI_DEV_FB_USED" => t.memory_used_bytes as f64 / MIB,
                "DCGM_FI_DEV_FB_FREE" => {
                    t.memory_total_bytes.saturating_sub(t.memory_used_bytes) as f64 / MIB
                }
                "DCGM_FI_DEV_GPU_TEMP" => f64::from(t.temperature_celsius),
                "DCGM_FI_DEV_POWER_USAGE" => t.power_watts,
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" => t.ecc_corrected_errors as f64,
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" => t.ecc_uncorrected_errors as f64,
                _ => t.xid_errors as f64,
            };
            e.sample(name, &labels, v);
        }
    }
    let d = reconciler.driver();
    let s = d.stats();
    e.scalar(
        "fmsched_agent_processes",
        Kind::Gauge,
        "Training processes running.",
        d.running().await as f64,
    );
    e.scalar(
        "fmsched_agent_launches_total",
        Kind::Counter,
        "Training processes started (fresh or resumed).",
        s.launches as f64,
    );
    e.scalar(
        "fmsched_agent_suspends_total",
        Kind::Counter,
        "Suspensions (checkpoint, then stop).",
        s.suspends as f64,
    );
    e.scalar(
        "fmsched_agent_suspend_seconds_sum",
        Kind::Counter,
        "Seconds spent suspending processes.",
        s.suspend_seconds_sum,
    );
    e.scalar(
        "fmsched_agent_kills_total",
        Kind::Counter,
        "Processes killed after ignoring SIGTERM for the grace period.",
        s.kills as f64,
    );
    let w = reconciler.switch_stats();
    e.scalar(
        "fmsched_agent_standby_launches_total",
        Kind::Counter,
        "Processes launched in standby on a pipeline-switch hint (Ymir §6.2).",
        w.standby_launches as f64,
    );
    e.scalar(
        "fmsched_agent_standby_started_total",
        Kind::Counter,
        "Standby processes a plan started: switches that paid no loader time.",
        w.standby_started as f64,
    );
    e.scalar(
        "fmsched_agent_standby_wasted_total",
        Kind::Counter,
        "Standby processes stopped unused (the next plan differed from the hint).",
        w.standby_wasted as f64,
    );
    e.scalar(
        "fmsched_agent_standby_refused_total",
        Kind::Counter,
        "Switch hints refused: processes.max_standby processes were waiting already.",
        w.standby_refused as f64,
    );
    e.scalar(
        "fmsched_agent_standby_lead_seconds_sum",
        Kind::Counter,
        "Seconds from standby launch to start, summed over started standbys.",
        w.standby_lead_seconds_sum,
    );
    e.scalar(
        "fmsched_agent_warm_processes",
        Kind::Gauge,
        "Warm processes: a finished prompt-tuning task's process waiting with its model loaded (PromptTuner warm pool).",
        reconciler.warm_report().len() as f64,
    );
    e.scalar(
        "fmsched_agent_warm_starts_total",
        Kind::Counter,
        "Warm tasks handed to a warm process of their model (no launch, no weight load).",
        w.warm_starts as f64,
    );
    e.scalar(
        "fmsched_agent_cold_starts_total",
        Kind::Counter,
        "Warm tasks launched afresh: no warm process of their model held exactly their GPUs.",
        w.cold_starts as f64,
    );
    e.scalar(
        "fmsched_agent_warm_released_total",
        Kind::Counter,
        "Warm processes stopped after idling the plan's warm_idle_release (60 s).",
        w.warm_released as f64,
    );
    e.scalar(
        "fmsched_agent_warm_evicted_total",
        Kind::Counter,
        "Warm processes stopped because the plan gave their GPUs to another task.",
        w.warm_evicted as f64,
    );
    e.finish()
}
