//! Analytic throughput model: the source of fmsched's shipped default
//! profiles (`estimator-svc/profiles/default-<GPU>.csv`).
//!
//! Published measured profiles may not be redistributed with the project,
//! so the defaults are *computed* from model and GPU data sheets with the
//! forward / backward / synchronisation decomposition of ICEFROG Eq. 5:
//! `T_iter = T_fwd + (T_bwd^γ + T_sync^γ)^{1/γ}`. Operators replace them
//! with measured tables (`docs/profiles.md`); the profiling runs of the node
//! agent write the same layout.
//!
//! Every constant below carries its source. The model is deliberately
//! simple; `estimator-accuracy` prints how far it is from measured tables
//! when those are at hand.

use std::fmt::Write as _;

use crate::icefrog::iteration_time;
use crate::lut::{Lut, LutError, Variant, canonical_placement};

/// Architecture of one foundation model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelArch {
    pub name: &'static str,
    /// Parameters.
    pub params: f64,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    /// Tokens per training sample.
    pub seq_len: u32,
    /// Mixture-of-Experts: experts per MoE layer (0 = a dense model).
    pub experts: u32,
    /// Experts each token is routed to (top-k gating).
    pub top_k: u32,
    /// Layers whose FFN is an MoE layer.
    pub moe_layers: u32,
    /// Parameters of one expert summed over the MoE layers.
    pub expert_params: f64,
}

/// Published architectures (parameter, layer, hidden and head counts from
/// each model's paper / released configuration):
/// - RoBERTa (Liu et al. 2019) and BERT (Devlin et al. 2019): base 12×768,
///   12 heads; large 24×1024, 16 heads; samples padded to the 512-token
///   maximum position of the released models.
/// - ViT (Dosovitskiy et al. 2021, Table 1): B/16 12×768, L/16 24×1024;
///   224×224 images in 16×16 patches = 196 patches + CLS = 197 tokens.
/// - GPT-2 small (Radford et al. 2019): 12×768, 1,024-token context.
/// - Llama-2-7B (Touvron et al. 2023, Table 1) and Mistral-7B (Jiang et al.
///   2023): 32×4096, 32 heads; 2,048-token fine-tuning samples.
/// - Switch Transformers (Fedus et al. 2022; the released `switch-base-8` and
///   `switch-base-16`): T5-base, 12 encoder + 12 decoder layers of 768, 12
///   heads, every other FFN an MoE layer (12 of them) of 8 / 16 experts
///   (768→3,072→768: 4.7 M parameters each per layer), top-1 gating; 620 M
///   and 1.07 B parameters.
pub const MODELS: [ModelArch; 11] = [
    arch("roberta-base", 125e6, 12, 768, 12, 512),
    arch("roberta-large", 355e6, 24, 1024, 16, 512),
    arch("bert-base", 110e6, 12, 768, 12, 512),
    arch("bert-large", 340e6, 24, 1024, 16, 512),
    arch("vit-base", 86e6, 12, 768, 12, 197),
    arch("vit-large", 307e6, 24, 1024, 16, 197),
    arch("gpt2", 124e6, 12, 768, 12, 1024),
    arch("llama-2-7b", 6.738e9, 32, 4096, 32, 2048),
    arch("mistral-7b", 7.242e9, 32, 4096, 32, 2048),
    moe("switch-base-8", 620e6, 24, 768, 12, 512, 8),
    moe("switch-base-16", 1.073e9, 24, 768, 12, 512, 16),
];

/// A Switch-style MoE model (see [`MODELS`]): top-1 gating, MoE FFNs on
/// half of the layers, experts of `2·h·4h` parameters per MoE layer.
const fn moe(
    name: &'static str,
    params: f64,
    layers: u32,
    hidden: u32,
    heads: u32,
    seq_len: u32,
    experts: u32,
) -> ModelArch {
    let h = hidden as f64;
    ModelArch {
        experts,
        top_k: 1,
        moe_layers: layers / 2,
        expert_params: (layers / 2) as f64 * 8.0 * h * h,
        ..arch(name, params, layers, hidden, heads, seq_len)
    }
}

const fn arch(
    name: &'static str,
    params: f64,
    layers: u32,
    hidden: u32,
    heads: u32,
    seq_len: u32,
) -> ModelArch {
    ModelArch {
        name,
        params,
        layers,
        hidden,
        heads,
        seq_len,
        experts: 0,
        top_k: 0,
        moe_layers: 0,
        expert_params: 0.0,
    }
}

/// One GPU type and the network around it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: &'static str,
    /// Dense FP16/BF16 tensor-core peak, FLOP/s.
    pub peak_flops: f64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bytes_s: f64,
    pub memory_gib: f64,
    /// All-reduce bus bandwidth inside a node, bytes/s.
    pub intra_bytes_s: f64,
    /// All-reduce bus bandwidth between nodes, bytes/s.
    pub inter_bytes_s: f64,
    pub gpus_per_node: u32,
}

/// NVIDIA data sheets (V100 SXM2 32 GB, A100 SXM4 80 GB, H100 SXM5 80 GB):
/// dense tensor peak 125 / 312 / 989 TFLOP/s, HBM 900 / 2,039 / 3,350 GB/s,
/// NVLink 300 / 600 / 900 GB/s per GPU, of which NCCL's all-reduce reaches
/// about half as bus bandwidth (nccl-tests' published DGX results).
/// Inter-node: one 100 / 200 / 400 Gb/s InfiniBand port per node (EDR /
/// HDR / NDR, the DGX-1 / DGX A100 / DGX H100 generations) at 80 %
/// efficiency. Four GPUs per node, as in the Ymir and ICEFROG testbeds.
pub const GPUS: [GpuSpec; 3] = [
    gpu("V100", 125e12, 900e9, 32.0, 150e9, 10e9),
    gpu("A100", 312e12, 2039e9, 80.0, 300e9, 20e9),
    gpu("H100", 989e12, 3350e9, 80.0, 450e9, 40e9),
];

const fn gpu(
    name: &'static str,
    peak_flops: f64,
    hbm_bytes_s: f64,
    memory_gib: f64,
    intra_bytes_s: f64,
    inter_bytes_s: f64,
) -> GpuSpec {
    GpuSpec {
        name,
        peak_flops,
        hbm_bytes_s,
        memory_gib,
        intra_bytes_s,
        inter_bytes_s,
        gpus_per_node: 4,
    }
}

/// Best achieved fraction of peak (model FLOPs utilisation). Megatron-LM
/// reports 44–52 % on A100 for large models (Narayanan et al. 2021, §5.1);
/// fine-tuning small models in eager PyTorch sits lower, so 0.40.
pub const MFU_MAX: f64 = 0.40;
/// Tokens per GPU per step at which half of `MFU_MAX` is reached: small
/// batches leave tensor cores idle (kernel-level efficiency curves in
/// NVIDIA's Deep Learning Performance guide saturate around 4–8 K tokens).
pub const MFU_HALF_TOKENS: f64 = 4096.0;
/// Kernel-launch and framework overhead per layer per step: ~40 kernels per
/// transformer layer (forward + backward) at ~6 µs each in eager PyTorch.
pub const LAUNCH_S_PER_LAYER: f64 = 0.25e-3;
/// Mixed-precision Adam keeps 16 bytes per parameter (fp16 weight and
/// gradient, fp32 master weight, two moments; ZeRO, Rajbhandari et al.
/// 2020, §3.1); the optimizer step streams about twice that through HBM.
pub const ADAM_STATE_BYTES: f64 = 16.0;
/// Activation memory per sample, fp16, no recomputation: `s·h·L·(34 +
/// 5·a·s/h)` bytes (Korthikanti et al. 2022, Eq. 1 with t = 1).
pub const ACT_BYTES_PER_UNIT: f64 = 34.0;
/// CUDA context and allocator reserve per GPU.
pub const CUDA_RESERVE_GIB: f64 = 1.0;
/// Overlap of backward and gradient all-reduce in ICEFROG Eq. 5 (γ = 1: none;
/// PyTorch DDP's bucketed all-reduce overlaps most of it).
pub const OVERLAP_GAMMA: f64 = 2.0;
/// Context switch = process start and CUDA/framework initialisation (about
/// 10 s for a PyTorch + transformers trainer) + checkpoint write and read of
/// weights and optimizer state at 1 GB/s each way (network file system).
pub const PROCESS_START_S: f64 = 10.0;
pub const CHECKPOINT_BYTES_S: f64 = 1e9;
/// LoRA (Hu et al. 2022) trains ~0.5 % of the parameters; the frozen
/// backbone is kept in fp16 (2 bytes/parameter) and needs no weight
/// gradients (backward ≈ activation gradients only, half the FLOPs).
pub const LORA_TRAINABLE: f64 = 0.005;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

impl ModelArch {
    /// A Mixture-of-Experts model.
    pub fn is_moe(&self) -> bool {
        self.experts > 0
    }

    /// Parameters a token passes through: all of a dense model's; of an MoE
    /// model, the dense part and `top_k` experts. A batch's MoE layer waits
    /// for its tokens routed to the most experts, so this is the gating's
    /// *maximum* k, never an average: with adaptive gating sending 80 % of
    /// the tokens to one expert, compute falls to 0.6× while the MoE layer's
    /// time only falls to 0.76× (Lina thesis Table 5.1) — time is not
    /// scaled by FLOPs saved.
    pub fn active_params(&self) -> f64 {
        self.params - f64::from(self.experts.saturating_sub(self.top_k)) * self.expert_params
    }

    /// Parameters one GPU holds when the experts are spread over `ep` GPUs
    /// (expert parallelism) and the rest is replicated.
    pub fn params_per_gpu(&self, ep: u32) -> f64 {
        let experts = f64::from(self.experts) * self.expert_params;
        self.params - experts + experts / f64::from(ep.clamp(1, self.experts.max(1)))
    }

    /// Training FLOPs of one sample: 6·P per token (Kaplan et al. 2020,
    /// §2.1; P the parameters a token passes through,
    /// [`ModelArch::active_params`]) plus attention scores, 12·L·s·h per
    /// token (forward 4·L·s·h, backward twice that).
    pub fn flops_per_sample(&self) -> f64 {
        let s = f64::from(self.seq_len);
        let attn = 12.0 * f64::from(self.layers) * s * f64::from(self.hidden);
        s * (6.0 * self.active_params() + attn)
    }

    /// Activation bytes of one sample (Korthikanti et al. 2022, Eq. 1).
    pub fn activation_bytes(&self) -> f64 {
        let (s, h, l, a) = (
            f64::from(self.seq_len),
            f64::from(self.hidden),
            f64::from(self.layers),
            f64::from(self.heads),
        );
        s * h * l * (ACT_BYTES_PER_UNIT + 5.0 * a * s / h)
    }
}

/// How a variant changes compute, memory and synchronisation.
struct VariantCost {
    /// Multiplier of the full-fine-tuning training FLOPs.
    compute: f64,
    /// Bytes per parameter resident on the GPU.
    state_bytes: f64,
    /// Fraction of parameters whose gradients are all-reduced.
    synced: f64,
}

fn variant_cost(v: &Variant) -> VariantCost {
    if v.petl.is_empty() {
        VariantCost {
            compute: 1.0,
            state_bytes: ADAM_STATE_BYTES,
            synced: 1.0,
        }
    } else {
        VariantCost {
            // forward (1/3) + activation gradients (1/3) of 6·P.
            compute: 2.0 / 3.0,
            state_bytes: 2.0 + ADAM_STATE_BYTES * LORA_TRAINABLE,
            synced: LORA_TRAINABLE,
        }
    }
}

/// (step, sync, memory GiB) of a data-parallel placement at a local batch.
fn data_parallel_step(
    m: &ModelArch,
    g: &GpuSpec,
    v: &Variant,
    nodes: u32,
    gpus: u32,
    bsz: u32,
) -> (f64, f64, f64) {
    let cost = variant_cost(v);
    let tokens = f64::from(bsz) * f64::from(m.seq_len);
    let mfu = MFU_MAX * tokens / (tokens + MFU_HALF_TOKENS);
    let compute = cost.compute * f64::from(bsz) * m.flops_per_sample() / (g.peak_flops * mfu);
    // An MoE job spreads its experts over its expert-parallel group (never
    // across a node: the scheduler keeps every group on one node), or holds
    // all of them on every GPU (no group); a dense one holds everything
    // everywhere.
    let ep = if m.is_moe() {
        v.expert_parallel.max(1)
    } else {
        1
    };
    let held = m.params_per_gpu(ep);
    let optimizer = 2.0 * ADAM_STATE_BYTES * held * cost.synced / g.hbm_bytes_s;
    let overhead = LAUNCH_S_PER_LAYER * f64::from(m.layers) + optimizer;
    let all_to_all = all_to_all_s(m, g, ep, bsz);
    // Ring all-reduce of fp16 gradients: 2·(R−1)/R · bytes / bus bandwidth.
    let sync = if gpus > 1 {
        let bytes = 2.0 * held * cost.synced;
        let bw = if nodes > 1 {
            g.inter_bytes_s
        } else {
            g.intra_bytes_s
        };
        2.0 * f64::from(gpus - 1) / f64::from(gpus) * bytes / bw
    } else {
        0.0
    };
    // ICEFROG Eq. 5 with forward = 1/3 and backward = 2/3 of the compute.
    let step = iteration_time(compute / 3.0, 2.0 * compute / 3.0, sync, OVERLAP_GAMMA)
        + overhead
        + all_to_all;
    // What synchronisation adds to the step (the LUT's `sync_time`).
    let exposed_sync = if sync > 0.0 {
        step - compute - overhead - all_to_all
    } else {
        0.0
    };
    let memory =
        (cost.state_bytes * held + f64::from(bsz) * m.activation_bytes()) / GIB + CUDA_RESERVE_GIB;
    (step, exposed_sync.max(0.0), memory)
}

/// Seconds of expert-parallel all-to-all in one step at local batch `bsz`
/// with the experts spread over `ep` GPUs of one node: every MoE layer
/// sends each token to its experts and back, forward and backward (4
/// all-to-alls of `top_k` fp16 hidden vectors per token; Lina thesis
/// §4.2.1); the `(ep−1)/ep` that leaves a GPU crosses NVLink and the step
/// waits for it (no overlap). Bandwidth-only: the analytic table leaves out
/// the small-message latency and the contention with the gradient
/// all-reduce that made all-to-all 34.1 % of Lina's measured step times
/// (Table 4.1) — measured profiles (`docs/profiles.md`) carry those.
pub fn all_to_all_s(m: &ModelArch, g: &GpuSpec, ep: u32, bsz: u32) -> f64 {
    if !m.is_moe() || ep <= 1 {
        return 0.0;
    }
    let tokens = f64::from(bsz) * f64::from(m.seq_len);
    let bytes =
        4.0 * f64::from(m.moe_layers) * tokens * f64::from(m.top_k) * f64::from(m.hidden) * 2.0;
    bytes * f64::from(ep - 1) / f64::from(ep) / g.intra_bytes_s
}

/// Pipeline-parallel step (GPipe, Huang et al. 2019): the model split over
/// the `per_node` GPUs of each node, one micro-batch per sample; a step of
/// `m` micro-batches on `p` stages takes `(m + p − 1)` stage-times (the
/// bubble), and the nodes are data-parallel replicas that all-reduce each
/// stage's gradients.
fn pipeline_step(m: &ModelArch, g: &GpuSpec, v: &Variant, nodes: u32, bsz: u32) -> (f64, f64, f64) {
    let p = g.gpus_per_node;
    let cost = variant_cost(v);
    let tokens = f64::from(m.seq_len);
    let mfu = MFU_MAX * tokens / (tokens + MFU_HALF_TOKENS);
    let stage = cost.compute * m.flops_per_sample() / f64::from(p) / (g.peak_flops * mfu);
    let compute = f64::from(bsz + p - 1) * stage;
    let stage_params = m.params / f64::from(p);
    let optimizer = 2.0 * ADAM_STATE_BYTES * stage_params * cost.synced / g.hbm_bytes_s;
    let overhead = LAUNCH_S_PER_LAYER * f64::from(m.layers) + optimizer;
    let sync = if nodes > 1 {
        let bytes = 2.0 * stage_params * cost.synced;
        2.0 * f64::from(nodes - 1) / f64::from(nodes) * bytes / g.inter_bytes_s
    } else {
        0.0
    };
    // The all-reduce starts after the last micro-batch's backward: no overlap.
    let step = compute + sync + overhead;
    // GPipe keeps the activations of all in-flight micro-batches of a stage.
    let memory = (cost.state_bytes * stage_params
        + f64::from(bsz) * m.activation_bytes() / f64::from(p))
        / GIB
        + CUDA_RESERVE_GIB;
    (step, sync, memory)
}

/// Context-switch seconds: process start plus writing and reading the
/// trainable state (see [`PROCESS_START_S`]).
pub fn context_switch_s(m: &ModelArch, v: &Variant) -> f64 {
    let cost = variant_cost(v);
    let trainable = if v.petl.is_empty() {
        1.0
    } else {
        LORA_TRAINABLE
    };
    PROCESS_START_S
        + 2.0 * cost.state_bytes.min(ADAM_STATE_BYTES) * m.params * trainable / CHECKPOINT_BYTES_S
}

/// Data-parallel placements profiled: 1–4 GPUs on one node, then whole
/// nodes up to 8 (the shapes Ymir's allocation set {0,1,2,3,4m} produces).
pub const DP_PLACEMENTS: [&str; 8] = ["1", "2", "3", "4", "44", "444", "4444", "44444444"];
pub const PIPELINE_PLACEMENTS: [&str; 4] = ["4", "44", "4444", "44444444"];
/// Local batches profiled (rows past the GPU's memory are still written, with
/// their memory, so the table says *why* a batch is infeasible).
pub const LOCAL_BATCHES: [u32; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// Expert-parallel group sizes profiled for an MoE model: those of
/// [`EXPERT_GROUPS`] that divide its experts (a group of more GPUs than a
/// profiled node share, 8 or 16, is looked up in the largest profiled
/// group's table).
pub const EXPERT_GROUPS: [u32; 2] = [2, 4];

/// The variants profiled for a model: full fine-tuning (AMP) for all,
/// pipeline for dense ones, each expert-parallel group size of
/// [`EXPERT_GROUPS`] for MoE ones; LoRA for models of a billion parameters
/// or more, whose full fine-tuning does not fit a single GPU.
pub fn variants(m: &ModelArch) -> Vec<Variant> {
    let base = Variant::base();
    let mut v = vec![base.clone()];
    for ep in EXPERT_GROUPS {
        if m.is_moe() && m.experts.is_multiple_of(ep) {
            v.push(Variant {
                expert_parallel: ep,
                ..base.clone()
            });
        }
    }
    // MoE models train data- and expert-parallel, not in a pipeline.
    if !m.is_moe() {
        v.push(Variant {
            pipeline: true,
            ..base.clone()
        });
    }
    if m.params >= 1e9 {
        let lora: Vec<Variant> = v
            .iter()
            .filter(|x| !x.pipeline)
            .map(|x| Variant {
                petl: "lora".into(),
                ..x.clone()
            })
            .collect();
        v.extend(lora);
    }
    v
}

/// Header of fmsched's own profile layout (`docs/profiles.md`).
pub const FMSCHED_HEADER: &str = "model,gpu_type,placement,local_bsz,step_time,sync_time,amp,frozen_layers,grad_ckpt,petl,pipeline,gpu_memory_gib,context_switch_s,expert_parallel";

/// The default profile of one GPU type, in fmsched's layout.
pub fn default_profile_csv(g: &GpuSpec) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# fmsched default profile for {}: computed by estimator-svc's analytic model \
         (src/analytic.rs), not measured. Regenerate with `estimator-svc write-default-profiles DIR`.",
        g.name
    );
    let _ = writeln!(out, "{FMSCHED_HEADER}");
    for m in &MODELS {
        for v in variants(m) {
            let placements: &[&str] = if v.pipeline {
                &PIPELINE_PLACEMENTS
            } else {
                &DP_PLACEMENTS
            };
            // An expert-parallel group sits on one node: only placements
            // of whole groups per node.
            let whole_groups = |p: &&&str| {
                p.bytes()
                    .all(|b| u32::from(b - b'0').is_multiple_of(v.expert_parallel.max(1)))
            };
            for p in placements.iter().filter(whole_groups) {
                let nodes = p.len() as u32;
                let gpus: u32 = p.bytes().map(|b| u32::from(b - b'0')).sum();
                for &bsz in &LOCAL_BATCHES {
                    let (step, sync, mem) = if v.pipeline {
                        pipeline_step(m, g, &v, nodes, bsz)
                    } else {
                        data_parallel_step(m, g, &v, nodes, gpus, bsz)
                    };
                    let _ = writeln!(
                        out,
                        "{},{},{},{},{:.6},{:.6},{},0,0,{},{},{:.3},{:.1},{}",
                        m.name,
                        g.name,
                        p,
                        bsz,
                        step,
                        sync,
                        u8::from(v.amp),
                        if v.petl.is_empty() { "none" } else { &v.petl },
                        u8::from(v.pipeline),
                        mem,
                        context_switch_s(m, &v),
                        v.expert_parallel,
                    );
                }
            }
        }
    }
    out
}

/// A lookup table holding every default profile (all models × GPU types).
pub fn default_lut() -> Result<Lut, LutError> {
    let mut lut = Lut::default();
    for g in &GPUS {
        lut.import_csv(
            "",
            g.name,
            "fmsched",
            &format!("default-{}.csv", g.name),
            &default_profile_csv(g),
        )?;
        lut.gpu_memory.insert(g.name.to_string(), g.memory_gib);
    }
    Ok(lut)
}

/// Parameters of a model with a default profile.
pub fn params_of(model: &str) -> Option<f64> {
    MODELS.iter().find(|m| m.name == model).map(|m| m.params)
}

/// Layer count of a model with a default profile.
pub fn layers_of(model: &str) -> Option<u32> {
    MODELS.iter().find(|m| m.name == model).map(|m| m.layers)
}

/// Canonical name of a GPU type reported by NVML or written by a user
/// ("Tesla V100-SXM2-32GB" → "V100"); unknown names are kept as given.
pub fn gpu_family(name: &str) -> String {
    let up = name.to_ascii_uppercase();
    GPUS.iter()
        .find(|g| up.contains(g.name))
        .map(|g| g.name.to_string())
        .unwrap_or_else(|| name.to_string())
}

/// Placement shape check used by callers that build keys by hand.
pub fn placement_gpus(p: &str) -> Result<u32, LutError> {
    Ok(canonical_placement(p)?
        .bytes()
        .map(|b| u32::from(b - b'0'))
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str) -> &'static ModelArch {
        MODELS.iter().find(|m| m.name == name).unwrap()
    }

    #[test]
    fn flops_and_memory_by_hand() {
        let m = model("roberta-base");
        // 512 · (6 · 125e6 + 12 · 12 · 512 · 768)
        let want = 512.0 * (6.0 * 125e6 + 12.0 * 12.0 * 512.0 * 768.0);
        assert!((m.flops_per_sample() - want).abs() < 1.0);
        // 512 · 768 · 12 · (34 + 5 · 12 · 512 / 768) = 512·768·12·74
        assert!((m.activation_bytes() - 512.0 * 768.0 * 12.0 * 74.0).abs() < 1.0);
    }

    #[test]
    fn more_gpus_are_faster_per_sample_and_bigger_batches_take_longer() {
        let g = &GPUS[0];
        let m = model("roberta-base");
        let v = Variant::base();
        let (s1, y1, _) = data_parallel_step(m, g, &v, 1, 1, 8);
        let (s4, y4, _) = data_parallel_step(m, g, &v, 1, 4, 8);
        let (s44, y44, _) = data_parallel_step(m, g, &v, 2, 8, 8);
        assert_eq!(y1, 0.0);
        assert!(
            s1 < s4 && s4 < s44,
            "sync makes a step longer: {s1} {s4} {s44}"
        );
        assert!(
            y4 > 0.0 && y44 > y4,
            "inter-node sync is slower: {y4} {y44}"
        );
        // Throughput: 4 GPUs × 8 samples beat 1 GPU × 8 samples per second.
        assert!(32.0 / s4 > 3.0 * 8.0 / s1);
        let (s16, _, mem16) = data_parallel_step(m, g, &v, 1, 1, 16);
        let (_, _, mem8) = data_parallel_step(m, g, &v, 1, 1, 8);
        assert!(s16 > s1 && mem16 > mem8);
    }

    /// An MoE model's compute is its dense part plus the gating's top-k
    /// experts per token; its experts are spread over its expert-parallel
    /// group, so each GPU holds fewer parameters as the group grows, and
    /// the all-to-all appears only with expert parallelism (ep > 1).
    #[test]
    fn moe_steps_count_active_experts_and_all_to_all() {
        let m = model("switch-base-8");
        assert!(m.is_moe() && m.top_k == 1 && m.moe_layers == 12);
        let expert = m.expert_params;
        assert!((expert - 12.0 * 8.0 * 768.0 * 768.0).abs() < 1.0);
        // Dense part + one expert, not all eight.
        assert!((m.active_params() - (m.params - 7.0 * expert)).abs() < 1.0);
        assert!(m.params_per_gpu(4) < m.params_per_gpu(1));
        assert!((m.params_per_gpu(8) - (m.params - 7.0 * expert)).abs() < 1.0);
        let g = &GPUS[1];
        let v = Variant::base();
        let ep4 = Variant {
            expert_parallel: 4,
            ..Variant::base()
        };
        let (s1, _, mem1) = data_parallel_step(m, g, &v, 1, 1, 8);
        let (s4, _, mem4) = data_parallel_step(m, g, &ep4, 1, 4, 8);
        assert!(mem4 < mem1, "experts spread over 4 GPUs: {mem4} < {mem1}");
        assert!(32.0 / s4 > 8.0 / s1, "more GPUs, more samples per second");
        // Without a group every GPU holds all experts, whatever the
        // placement: memory as on one GPU, and no all-to-all.
        let (s4_plain, _, mem4_plain) = data_parallel_step(m, g, &v, 1, 4, 8);
        assert_eq!(mem4_plain, mem1);
        assert!(s4_plain != s4, "a group's all-to-all and smaller optimizer");
        // All-to-all: none without expert parallelism or for a dense
        // model; by hand at ep = 4: 4 · 12 layers · 8·512 tokens · 768 · 2
        // bytes · 3/4 over NVLink.
        assert_eq!(all_to_all_s(m, g, 1, 8), 0.0);
        assert_eq!(all_to_all_s(model("roberta-base"), g, 4, 8), 0.0);
        let want = 4.0 * 12.0 * 4096.0 * 768.0 * 2.0 * 0.75 / g.intra_bytes_s;
        assert!((all_to_all_s(m, g, 4, 8) - want).abs() < 1e-12);
        assert!(all_to_all_s(m, g, 8, 8) > all_to_all_s(m, g, 4, 8));
        // Dense models pay no all-to-all; no pipeline variant for MoE, one
        // table per profiled group size that divides the experts.
        assert!(!model("roberta-base").is_moe());
        assert!(variants(m).iter().all(|v| !v.pipeline));
        let groups = |name| {
            variants(model(name))
                .iter()
                .filter(|v| v.petl.is_empty())
                .map(|v| v.expert_parallel)
                .collect::<Vec<_>>()
        };
        assert_eq!(groups("switch-base-8"), [0, 2, 4]);
        assert_eq!(groups("switch-base-16"), [0, 2, 4]);
        assert_eq!(groups("roberta-base"), [0, 0]);
        let lut = default_lut().unwrap();
        for gpu in ["V100", "A100", "H100"] {
            for name in ["switch-base-8", "switch-base-16"] {
                let it = lut.iteration_time(name, gpu, 4, 4, 32, &v, 24).unwrap();
                assert!(it.feasible && it.seconds > 0.0, "{name} on {gpu}: {it:?}");
            }
        }
    }

    /// A job's expert-parallel group picks its table: at one placement a
    /// group of 2 and a group of 4 get different rows (before, every MoE
    /// row assumed the experts spread over the whole node share), a group
    /// table never holds a placement that splits a group, and a group no
    /// default table has (8) is read from the nearest one, as an estimate.
    #[test]
    fn an_expert_parallel_job_is_estimated_at_its_own_group_size() {
        let lut = default_lut().unwrap();
        let m = model("switch-base-8");
        let g = &GPUS[1];
        let at = |ep: u32, placement: &str| {
            let v = Variant {
                expert_parallel: ep,
                ..Variant::base()
            };
            lut.step_time(
                &crate::lut::ThroughputKey {
                    model: m.name.into(),
                    gpu_type: g.name.into(),
                    placement: placement.into(),
                    local_bsz: 8,
                    grad_accum: 1,
                    variant: v.clone(),
                },
                m.layers,
            )
            .unwrap()
        };
        let (none, two, four) = (at(0, "4"), at(2, "4"), at(4, "4"));
        for (ep, row) in [(0, none), (2, two), (4, four)] {
            let v = Variant {
                expert_parallel: ep,
                ..Variant::base()
            };
            let (step, _, _) = data_parallel_step(m, g, &v, 1, 4, 8);
            assert!(
                (row.step - step).abs() < 1e-6 && !row.interpolated,
                "ep {ep}: the table's row is the model's: {row:?} vs {step}"
            );
        }
        assert!(none.step != two.step && two.step != four.step);
        // Groups of 4 hold half the experts per GPU that groups of 2 do.
        let mem = |ep| {
            let v = Variant {
                expert_parallel: ep,
                ..Variant::base()
            };
            data_parallel_step(m, g, &v, 1, 4, 8).2
        };
        assert!(mem(4) < mem(2) && mem(2) < mem(0));
        // No placement that splits a group of 4 over a node's 2 or 3 GPUs.
        let table = lut
            .profile(
                m.name,
                g.name,
                &Variant {
                    expert_parallel: 4,
                    ..Variant::base()
                },
            )
            .unwrap();
        assert!(
            table
                .placements
                .keys()
                .all(|p| p.bytes().all(|b| (b - b'0').is_multiple_of(4)))
        );
        // A group of 8: the group-of-4 table's row, marked as an estimate.
        let eight = at(8, "4");
        assert!((eight.step - four.step).abs() < 1e-9 && eight.interpolated);
    }

    #[test]
    fn seven_billion_full_fine_tuning_does_not_fit_one_gpu_but_lora_and_pipeline_do() {
        let lut = default_lut().unwrap();
        let full = lut
            .iteration_time("llama-2-7b", "A100", 1, 4, 8, &Variant::base(), 32)
            .unwrap();
        assert!(!full.feasible, "{full:?}");
        let lora = Variant {
            petl: "lora".into(),
            ..Variant::base()
        };
        assert!(
            lut.iteration_time("llama-2-7b", "A100", 1, 4, 8, &lora, 32)
                .unwrap()
                .feasible
        );
        let pipe = Variant {
            pipeline: true,
            ..Variant::base()
        };
        assert!(
            lut.iteration_time("llama-2-7b", "A100", 4, 4, 8, &pipe, 32)
                .unwrap()
                .feasible
        );
        // A spec's variant acts on memory too (it is derived, not
        // profiled): freezing 28 of 32 layers leaves 4 layers' optimizer
        // state, and full fine-tuning of the rest fits one GPU.
        let spec_variant = |frozen: u32, amp: bool| {
            let spec: fmsched_core::job::JobSpec = serde_json::from_value(serde_json::json!({
                "model": "llama-2-7b",
                "dataset": { "uri": "file:///d", "task": "sft" },
                "hyperparameters": { "global_batch_size": 8, "learning_rate": 2e-5, "amp": amp },
                "target": { "max_iterations": 100 },
                "resources": { "min_gpus": 1, "max_gpus": 1 },
                "frozen_layers": { "first": 0, "last": frozen - 1 },
                "launch": { "command": ["train"] }
            }))
            .unwrap();
            Variant::of_spec(&spec)
        };
        let frozen = lut
            .iteration_time("llama-2-7b", "A100", 1, 4, 8, &spec_variant(28, true), 32)
            .unwrap();
        assert!(frozen.feasible, "{frozen:?}");
        assert!(frozen.seconds < full.seconds, "{frozen:?} vs {full:?}");
        // fp32 (amp: false) about doubles a step.
        let fp32 = lut
            .iteration_time("llama-2-7b", "A100", 1, 4, 8, &spec_variant(28, false), 32)
            .unwrap();
        assert!(
            fp32.seconds > 1.8 * frozen.seconds,
            "{fp32:?} vs {frozen:?}"
        );
    }

    #[test]
    fn every_builtin_model_has_a_default_profile_on_every_gpu() {
        let lut = default_lut().unwrap();
        for m in &MODELS {
            for g in &GPUS {
                assert!(
                    lut.profile(m.name, g.name, &Variant::base()).is_some(),
                    "{} {}",
                    m.name,
                    g.name
                );
                assert!(lut.context_switch_s(m.name, g.name).unwrap() >= PROCESS_START_S);
            }
        }
        // The catalog the scheduler validates against has the same models.
        let catalog = fmsched_core::ModelCatalog::builtin();
        for m in &MODELS {
            let info = catalog.get(m.name).unwrap();
            assert_eq!(info.layers, m.layers, "{}", m.name);
        }
    }

    #[test]
    fn shipped_default_profiles_match_the_model() {
        for g in &GPUS {
            let path = format!(
                "{}/../estimator-svc/profiles/default-{}.csv",
                env!("CARGO_MANIFEST_DIR"),
                g.name
            );
            let shipped = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(
                shipped == default_profile_csv(g),
                "{path} is out of date: run `cargo run -p estimator-svc -- write-default-profiles estimator-svc/profiles`"
            );
        }
    }

    #[test]
    fn gpu_names_map_to_families() {
        assert_eq!(gpu_family("Tesla V100-SXM2-32GB"), "V100");
        assert_eq!(gpu_family("NVIDIA A100-SXM4-80GB"), "A100");
        assert_eq!(gpu_family("NVIDIA H100 80GB HBM3"), "H100");
        assert_eq!(gpu_family("RTX 4090"), "RTX 4090");
    }
}
