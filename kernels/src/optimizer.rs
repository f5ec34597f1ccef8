//! The learner's optimizer: AdamW on the model's own variables when they are f32, or AdamW on
//! f32 master copies when the model computes in bf16 / f16 (mixed precision).
//!
//! Why master weights: SmolLM2 trains at lr 1e-6 (DESIGN.md §2). A bf16 weight has an 8-bit
//! mantissa, so an update smaller than about 2⁻⁸ of the weight rounds away: most of an RL step
//! would be lost. The master copy (and the moments) stay f32; after each step the master is
//! rounded into the low-precision weights that generation and the forward pass use.
//!
//! The master update is the decoupled AdamW of Loshchilov & Hutter as PyTorch implements it
//! (`torch.optim.AdamW`, also what `tch::nn::AdamW` wraps): `p ← p·(1 − lr·wd)`, then the
//! bias-corrected Adam step. Memory: three f32 tensors per parameter (master, m, v), about
//! 1.6 GB for SmolLM2-135M, next to the 270 MB of bf16 weights.

use tch::nn::{self, OptimizerConfig};
use tch::{Kind, Tensor};

use crate::error::Result;
use crate::model::Model;

/// AdamW hyper-parameters (the learner's `lr`, `betas`, `eps`, `weight_decay`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AdamWConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

/// One trained parameter with its f32 master copy and moments.
#[derive(Debug)]
struct MasterParam {
    /// The model's variable (low precision); its `.grad` is what backward filled.
    param: Tensor,
    /// `[param shape]` f32.
    master: Tensor,
    /// First moment, `[param shape]` f32.
    m: Tensor,
    /// Second moment, `[param shape]` f32.
    v: Tensor,
}

/// AdamW over f32 master weights of a low-precision model.
#[derive(Debug)]
pub struct MasterAdamW {
    params: Vec<MasterParam>,
    config: AdamWConfig,
    /// Steps taken (for the bias correction).
    t: i32,
}

impl MasterAdamW {
    fn new(model: &Model, config: AdamWConfig) -> Result<Self> {
        let params = tch::no_grad(|| -> Result<Vec<MasterParam>> {
            model
                .var_store()
                .trainable_variables()
                .into_iter()
                .map(|param| {
                    let master = param.f_to_kind(Kind::Float)?.f_detach_copy()?;
                    Ok(MasterParam {
                        m: master.f_zeros_like()?,
                        v: master.f_zeros_like()?,
                        master,
                        param,
                    })
                })
                .collect()
        })?;
        Ok(Self {
            params,
            config,
            t: 0,
        })
    }

    fn step(&mut self) -> Result<()> {
        self.t += 1;
        let c = self.config;
        let (b1, b2) = c.betas;
        let bias1 = 1.0 - b1.powi(self.t);
        let bias2 = 1.0 - b2.powi(self.t);
        tch::no_grad(|| -> Result<()> {
            for p in &mut self.params {
                let grad = p.param.grad();
                if !grad.defined() {
                    continue;
                }
                let g = grad.f_to_kind(Kind::Float)?;
                let _ = p.master.f_mul_scalar_(1.0 - c.lr * c.weight_decay)?;
                let _ = p.m.f_mul_scalar_(b1)?.f_add_(&(&g * (1.0 - b1)))?;
                let _ = p.v.f_mul_scalar_(b2)?.f_add_(&(g.square() * (1.0 - b2)))?;
                let denom = (&p.v / bias2).f_sqrt()? + c.eps;
                let update = (&p.m / bias1) / denom * c.lr;
                let _ = p.master.f_sub_(&update)?;
                p.param.f_copy_(&p.master)?;
            }
            Ok(())
        })
    }

    /// Copies the model's current weights into the master copies and zeroes the moments (after
    /// the weights were replaced, e.g. a checkpoint load).
    fn resync(&mut self) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for p in &mut self.params {
                p.master.f_copy_(&p.param.f_to_kind(Kind::Float)?)?;
                let _ = p.m.f_zero_()?;
                let _ = p.v.f_zero_()?;
            }
            Ok(())
        })?;
        self.t = 0;
        Ok(())
    }

    fn zero_grad(&mut self) {
        for p in &mut self.params {
            let mut g = p.param.grad();
            if g.defined() {
                let _ = g.detach_().zero_();
            }
        }
    }
}

/// The optimizer a [`crate::Learner`] steps.
#[derive(Debug)]
pub enum Optimizer {
    /// libtorch's AdamW on the model's f32 variables.
    Full(nn::Optimizer),
    /// AdamW on f32 master copies of a bf16 / f16 model (see the module docs).
    Master(MasterAdamW),
}

impl Optimizer {
    /// AdamW for `model`: in place when the model is f32, else over f32 master weights.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] when libtorch cannot build the optimizer or allocate the master
    /// copies.
    pub(crate) fn adamw(model: &Model, config: AdamWConfig) -> Result<Self> {
        if model.dtype() == Kind::Float {
            let opt = nn::AdamW::default()
                .beta1(config.betas.0)
                .beta2(config.betas.1)
                .wd(config.weight_decay)
                .eps(config.eps)
                .build(model.var_store(), config.lr)?;
            Ok(Self::Full(opt))
        } else {
            Ok(Self::Master(MasterAdamW::new(model, config)?))
        }
    }

    /// True when the optimizer keeps f32 master weights.
    pub fn has_master_weights(&self) -> bool {
        matches!(self, Self::Master(_))
    }

    /// Sets the learning rate of the next steps.
    pub fn set_lr(&mut self, lr: f64) {
        match self {
            Self::Full(o) => o.set_lr(lr),
            Self::Master(o) => o.config.lr = lr,
        }
    }

    /// One AdamW step from the accumulated gradients.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] from the master update.
    pub fn step(&mut self) -> Result<()> {
        match self {
            Self::Full(o) => {
                o.step();
                Ok(())
            }
            Self::Master(o) => o.step(),
        }
    }

    /// Tells the optimizer the model's weights were replaced from outside (a checkpoint load):
    /// master weights are re-read from the model and the moments restart, so the next step
    /// does not write the old master back. A no-op for f32 models (AdamW steps the weights
    /// themselves; its moments are kept).
    ///
    /// # Errors
    /// [`crate::Error::Torch`] from the copy.
    pub fn weights_replaced(&mut self) -> Result<()> {
        match self {
            Self::Full(_) => Ok(()),
            Self::Master(o) => o.resync(),
        }
    }

    /// Zeroes the model's gradients.
    pub fn zero_grad(&mut self) {
        match self {
            Self::Full(o) => o.zero_grad(),
            Self::Master(o) => o.zero_grad(),
        }
    }
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;
    use crate::config::ModelConfig;

    fn config(lr: f64) -> AdamWConfig {
        AdamWConfig {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// Gives every trainable variable the gradient of `sum(p²)/2`, i.e. `p` itself.
    fn fill_grads(model: &Model) {
        let loss = tch::with_grad(|| {
            model
                .var_store()
                .trainable_variables()
                .iter()
                .map(|p| p.to_kind(Kind::Float).square().sum(Kind::Float) * 0.5)
                .fold(Tensor::from(0f32), |a, b| a + b)
        });
        loss.backward();
    }

    #[test]
    fn master_adamw_matches_libtorch_adamw_on_f32_weights() {
        // The same model in f32 through both paths: the master path must reproduce
        // torch.optim.AdamW (what tch's AdamW runs) step for step.
        let cfg = ModelConfig::tiny();
        let a = Model::random(&cfg, 3, Device::Cpu, Kind::Float).unwrap();
        let b = a.deep_copy().unwrap();
        let mut full = Optimizer::adamw(&a, config(1e-3)).unwrap();
        let mut master = Optimizer::Master(MasterAdamW::new(&b, config(1e-3)).unwrap());
        for _ in 0..3 {
            for (m, o) in [(&a, &mut full), (&b, &mut master)] {
                o.zero_grad();
                fill_grads(m);
                o.step().unwrap();
            }
        }
        let (va, vb) = (a.var_store().variables(), b.var_store().variables());
        let mut max_diff = 0f64;
        for (name, x) in &va {
            let d = (x - &vb[name]).abs().max().double_value(&[]);
            max_diff = max_diff.max(d);
        }
        assert!(
            max_diff < 1e-6,
            "master AdamW differs from libtorch AdamW by {max_diff}"
        );
        // And the weights did move.
        let moved = (&va["norm"]
            - Tensor::ones([cfg.hidden_size as i64], (Kind::Float, Device::Cpu)))
        .abs()
        .max()
        .double_value(&[]);
        assert!(moved > 1e-3, "norm moved by {moved}");
    }

    #[test]
    fn a_weight_load_resyncs_the_master_copies() {
        // Without the resync, the next step would write the stale master over loaded weights.
        let cfg = ModelConfig::tiny();
        let model = Model::random(&cfg, 7, Device::Cpu, Kind::BFloat16).unwrap();
        let other = Model::random(&cfg, 8, Device::Cpu, Kind::BFloat16).unwrap();
        let mut opt = Optimizer::adamw(&model, config(1e-6)).unwrap();
        tch::no_grad(|| {
            let src = other.var_store().variables();
            for (name, mut v) in model.var_store().variables() {
                v.copy_(&src[&name]);
            }
        });
        opt.weights_replaced().unwrap();
        opt.zero_grad();
        fill_grads(&model);
        opt.step().unwrap();
        let (a, b) = (model.var_store().variables(), other.var_store().variables());
        let far = a
            .iter()
            .map(|(n, t)| {
                (t.to_kind(Kind::Float) - b[n].to_kind(Kind::Float))
                    .abs()
                    .max()
                    .double_value(&[])
            })
            .fold(0f64, f64::max);
        // One lr-1e-6 step from the loaded weights: within bf16 rounding of them.
        assert!(far < 0.02, "weights are {far} from the loaded ones");
    }

    #[test]
    fn bf16_model_keeps_updates_below_its_precision_in_the_master() {
        // lr 1e-6 on weights ~1: each update is far below bf16's resolution (2^-8 ≈ 0.004 at
        // 1.0), so a bf16-only optimizer would never move the norm weights; the master does
        // and, after enough steps, the rounded bf16 weights follow.
        let cfg = ModelConfig::tiny();
        let model = Model::random(&cfg, 5, Device::Cpu, Kind::BFloat16).unwrap();
        let mut opt = Optimizer::adamw(&model, config(1e-3)).unwrap();
        assert!(opt.has_master_weights());
        let Optimizer::Master(inner) = &mut opt else {
            unreachable!()
        };
        inner.config.lr = 1e-4;
        for _ in 0..5 {
            opt.zero_grad();
            fill_grads(&model);
            opt.step().unwrap();
        }
        let Optimizer::Master(inner) = &opt else {
            unreachable!()
        };
        let norm = inner
            .params
            .iter()
            .find(|p| {
                p.param.size() == [cfg.hidden_size as i64] && p.param.kind() == Kind::BFloat16
            })
            .expect("a norm vector");
        // 5 Adam steps of ~lr each on weights at 1.0: the master moved by ≈ 5e-4 (+ decay).
        let master_moved = (1.0 - norm.master.mean(Kind::Float).double_value(&[])).abs();
        assert!(
            (4e-4..7e-4).contains(&master_moved),
            "master moved by {master_moved}"
        );
        // The bf16 copy is the rounded master: within bf16 resolution of it.
        let gap = (norm.param.to_kind(Kind::Float) - &norm.master)
            .abs()
            .max()
            .double_value(&[]);
        assert!(gap <= 4e-3, "bf16 weights are {gap} from the master");
    }
}
