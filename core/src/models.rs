//! The foundation models a cluster accepts jobs for.
//!
//! A job naming a model outside the catalog is rejected at submission: the
//! estimator has no profile for it and it could never be merged with anyone.
//! Operators extend the catalog in the scheduler's config.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the scheduler needs to know about one foundation model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    pub name: String,
    /// Transformer layers (bounds the frozen-layer range).
    pub layers: u32,
    /// Parameter count, in millions.
    pub parameters_millions: u32,
    /// Mixture-of-Experts: experts per MoE layer (0 = a dense model). An
    /// MoE model may be trained expert-parallel
    /// (`resources.expert_parallel`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub experts: u32,
    /// Experts each token is routed to (top-k gating; MoE models only).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub top_k: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl ModelInfo {
    /// A Mixture-of-Experts model.
    pub fn is_moe(&self) -> bool {
        self.experts > 0
    }
}

/// Why `ep` GPUs cannot be an expert-parallel group of `model` (with
/// `experts` experts per MoE layer; 0 = dense), or None when they can: the
/// model must be a Mixture-of-Experts one and the group must divide its
/// experts. One rule for job specs and for the estimator's keys.
pub fn expert_group_problem(model: &str, experts: u32, ep: u32) -> Option<String> {
    if experts == 0 {
        Some(format!(
            "{model} is a dense model; expert parallelism needs a Mixture-of-Experts model"
        ))
    } else if ep == 0 || !experts.is_multiple_of(ep) {
        Some(format!(
            "must divide the {experts} experts of {model} (got {ep})"
        ))
    } else {
        None
    }
}

/// Known models by name. Lookups are case-sensitive: names are identifiers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelCatalog {
    models: BTreeMap<String, ModelInfo>,
}

impl ModelCatalog {
    /// The models fmsched ships default profiles for (layer and parameter
    /// counts from the models' published configurations).
    pub fn builtin() -> Self {
        let mut c = ModelCatalog::default();
        for (name, layers, params, experts, top_k) in [
            ("roberta-base", 12, 125, 0, 0),
            ("roberta-large", 24, 355, 0, 0),
            ("bert-base", 12, 110, 0, 0),
            ("bert-large", 24, 340, 0, 0),
            ("vit-base", 12, 86, 0, 0),
            ("vit-large", 24, 307, 0, 0),
            ("gpt2", 12, 124, 0, 0),
            ("llama-2-7b", 32, 6738, 0, 0),
            ("mistral-7b", 32, 7242, 0, 0),
            // Switch Transformers (Fedus et al. 2022): top-1 gating.
            ("switch-base-8", 24, 620, 8, 1),
            ("switch-base-16", 24, 1073, 16, 1),
        ] {
            c.insert(ModelInfo {
                name: name.to_string(),
                layers,
                parameters_millions: params,
                experts,
                top_k,
            });
        }
        c
    }

    pub fn insert(&mut self, m: ModelInfo) {
        self.models.insert(m.name.clone(), m);
    }

    pub fn get(&self, name: &str) -> Option<&ModelInfo> {
        self.models.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.models.len()
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}
