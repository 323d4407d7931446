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
        for (name, layers, params) in [
            ("roberta-base", 12, 125),
            ("roberta-large", 24, 355),
            ("bert-base", 12, 110),
            ("bert-large", 24, 340),
            ("vit-base", 12, 86),
            ("vit-large", 24, 307),
            ("gpt2", 12, 124),
            ("llama-2-7b", 32, 6738),
            ("mistral-7b", 32, 7242),
        ] {
            c.insert(ModelInfo {
                name: name.to_string(),
                layers,
                parameters_millions: params,
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
