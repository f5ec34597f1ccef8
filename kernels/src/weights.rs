//! A checkpoint's tensors by HF name, in HF layout, as the model loader consumes them.
use std::collections::BTreeMap;

use tch::Tensor;

use crate::error::{Error, Result};

/// Named tensors (HF names such as `model.layers.0.self_attn.q_proj.weight`, HF layout
/// `[out_features, in_features]`), dequantised to f32 on the CPU.
///
/// The model takes each tensor it needs with [`Weights::take`]; [`Weights::finish`] then
/// rejects whatever was left over, so a checkpoint of the wrong family fails loudly.
#[derive(Debug, Default)]
pub struct Weights {
    tensors: BTreeMap<String, Tensor>,
}

impl Weights {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tensor; a second tensor of the same name replaces the first.
    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) {
        self.tensors.insert(name.into(), tensor);
    }

    /// Number of tensors held.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when no tensor is held.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Borrows a tensor without removing it.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Removes and returns `name`, checking its shape.
    ///
    /// # Errors
    /// [`Error::MissingTensor`] when absent, [`Error::ShapeMismatch`] when the shape differs.
    pub fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let tensor = self
            .tensors
            .remove(name)
            .ok_or_else(|| Error::MissingTensor {
                name: name.to_string(),
            })?;
        let found = tensor.size();
        if found != shape {
            return Err(Error::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                found,
            });
        }
        Ok(tensor)
    }

    /// Like [`Weights::take`] but `Ok(None)` when the tensor is absent.
    pub fn take_optional(&mut self, name: &str, shape: &[i64]) -> Result<Option<Tensor>> {
        if self.tensors.contains_key(name) {
            self.take(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Succeeds only when every tensor has been taken.
    ///
    /// # Errors
    /// [`Error::UnexpectedTensors`] listing the leftovers.
    pub fn finish(self) -> Result<()> {
        if self.tensors.is_empty() {
            Ok(())
        } else {
            Err(Error::UnexpectedTensors {
                names: self.tensors.into_keys().collect(),
            })
        }
    }
}
