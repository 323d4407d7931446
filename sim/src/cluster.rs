//! The simulated cluster's shape: groups of identical nodes. The engine,
//! the catalog's checks and the loaned inference pool all read it.

/// Nodes of one kind: `count` nodes of `gpus` GPUs of `gpu_type` each.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGroup {
    /// A GPU model or family (`V100`, `A100-80GB`, …; reduced to its family
    /// by `fmsched_estimator::analytic::gpu_family`).
    pub gpu_type: String,
    pub count: u32,
    pub gpus: u32,
}

impl NodeGroup {
    pub fn new(gpu_type: &str, count: u32, gpus: u32) -> Self {
        Self {
            gpu_type: gpu_type.to_string(),
            count,
            gpus,
        }
    }
}
