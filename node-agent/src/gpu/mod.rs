//! GPU discovery and telemetry. Two backends: [`nvml::NvmlBackend`] talks to
//! the NVIDIA driver; [`fake::FakeGpuBackend`] simulates GPUs for hosts
//! without one (tests, demos, docker-compose) and is named as such
//! everywhere it shows up (`gpu_backend = "fake"`).

pub mod fake;
pub mod nvml;

use fmsched_proto::v1 as pb;

/// A source of GPU inventory and telemetry.
///
/// `sample` may block for a few milliseconds per GPU (NVML calls); callers
/// on an async runtime run it with `spawn_blocking`.
pub trait GpuBackend: Send + Sync + 'static {
    /// `"nvml"` or `"fake"`, as reported to the scheduler.
    fn kind(&self) -> &'static str;
    /// Static facts of every GPU, ordered by index.
    fn inventory(&self) -> Vec<pb::GpuInfo>;
    /// Current telemetry of every GPU, ordered by index.
    fn sample(&self) -> Vec<pb::GpuTelemetry>;
    /// A training process started on these GPU indices, expected to keep
    /// `expected_utilization_pct` of each busy (0: unknown) — the fake
    /// backend makes its telemetry follow; real GPUs report by themselves.
    fn process_started(&self, _pid: u32, _gpu_indices: &[u32], _expected_utilization_pct: u32) {}
    /// The process ended.
    fn process_stopped(&self, _pid: u32) {}
}
