//! The learner's optimizer: AdamW over every trained variable, on f32 master copies when the
//! model computes in bf16 / f16 (mixed precision), on the f32 variables themselves otherwise.
//!
//! Why master weights: SmolLM2 trains at lr 1e-6 (DESIGN.md §2). A bf16 weight has an 8-bit
//! mantissa, so an update smaller than about 2⁻⁸ of the weight rounds away: most of an RL step
//! would be lost. The master copy (and the moments) stay f32; after each step the master is
//! rounded into the low-precision weights that generation and the forward pass use.
//!
//! The update is the decoupled AdamW of Loshchilov & Hutter as PyTorch implements it
//! (`torch.optim.AdamW`, also what `tch::nn::AdamW` wraps; the tests check it against the
//! latter): `p ← p·(1 − lr·wd)`, then the bias-corrected Adam step. It is our own so that its
//! whole state can be saved and restored for an exact resume ([`Optimizer::state`]). Memory:
//! two f32 moments per parameter, plus the f32 master of a low-precision one: about 1.6 GB for
//! SmolLM2-135M in bf16 next to its 270 MB of weights.

use std::collections::HashMap;
use std::path::Path;

use tch::{Kind, Tensor};

use crate::error::{Error, Result};
use crate::model::Model;

/// AdamW hyper-parameters (the learner's `lr`, `betas`, `eps`, `weight_decay`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AdamWConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

/// One trained parameter with its f32 master and moments.
#[derive(Debug)]
struct MasterParam {
    /// The VarStore name (it keys the saved state).
    name: String,
    /// The model's variable; its `.grad` is what backward filled.
    param: Tensor,
    /// `[param shape]` f32: a copy of a low-precision variable, or the f32 variable itself
    /// (shared storage).
    master: Tensor,
    /// Whether `master` is a separate copy (the variable is bf16 / f16).
    separate: bool,
    /// First moment, `[param shape]` f32.
    m: Tensor,
    /// Second moment, `[param shape]` f32.
    v: Tensor,
}

/// AdamW over the trained variables of one model.
#[derive(Debug)]
pub struct Optimizer {
    params: Vec<MasterParam>,
    config: AdamWConfig,
    /// Steps taken (for the bias correction).
    t: i64,
}

impl Optimizer {
    /// AdamW for `model`'s trainable variables, in name order: in place on f32 variables, over
    /// f32 master copies of bf16 / f16 ones.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] when libtorch cannot allocate the moments or the master copies.
    pub(crate) fn adamw(model: &Model, config: AdamWConfig) -> Result<Self> {
        let mut vars: Vec<(String, Tensor)> = model
            .var_store()
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let params = tch::no_grad(|| -> Result<Vec<MasterParam>> {
            vars.into_iter()
                .map(|(name, param)| {
                    let separate = param.kind() != Kind::Float;
                    let master = if separate {
                        param.f_to_kind(Kind::Float)?.f_detach_copy()?
                    } else {
                        param.shallow_clone()
                    };
                    Ok(MasterParam {
                        m: master.f_zeros_like()?,
                        v: master.f_zeros_like()?,
                        name,
                        param,
                        master,
                        separate,
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

    /// True when the optimizer keeps f32 master copies (a bf16 / f16 model).
    pub fn has_master_weights(&self) -> bool {
        self.params.iter().any(|p| p.separate)
    }

    /// Sets the learning rate of the next steps.
    pub fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }

    /// One AdamW step from the accumulated gradients; a parameter without a gradient is left
    /// as it is.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] from the update.
    pub fn step(&mut self) -> Result<()> {
        self.t += 1;
        let c = self.config;
        let (b1, b2) = c.betas;
        let bias1 = 1.0 - b1.powi(self.t as i32);
        let bias2 = 1.0 - b2.powi(self.t as i32);
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
                if p.separate {
                    p.param.f_copy_(&p.master)?;
                }
            }
            Ok(())
        })
    }

    /// Tells the optimizer the model's weights were replaced from outside (a checkpoint load):
    /// master copies are re-read from the model and the moments restart, so the next step
    /// neither writes an old master back nor follows moments of other weights. A resume then
    /// restores the saved state ([`Optimizer::load_state`]).
    ///
    /// # Errors
    /// [`crate::Error::Torch`] from the copy.
    pub fn weights_replaced(&mut self) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for p in &mut self.params {
                if p.separate {
                    p.master.f_copy_(&p.param.f_to_kind(Kind::Float)?)?;
                }
                let _ = p.m.f_zero_()?;
                let _ = p.v.f_zero_()?;
            }
            Ok(())
        })?;
        self.t = 0;
        Ok(())
    }

    /// Zeroes the model's gradients.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            let mut g = p.param.grad();
            if g.defined() {
                let _ = g.detach_().zero_();
            }
        }
    }

    /// Everything a resume needs, named: `adamw.t` (steps taken, `[1]` i64), and per trained
    /// parameter NAME `adamw.m/NAME`, `adamw.v/NAME` (`[shape]` f32) and, for a low-precision
    /// one, `adamw.master/NAME` (`[shape]` f32). The tensors share storage with the optimizer
    /// (on its device).
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("adamw.t".to_string(), Tensor::from_slice(&[self.t]))];
        for p in &self.params {
            out.push((format!("adamw.m/{}", p.name), p.m.shallow_clone()));
            out.push((format!("adamw.v/{}", p.name), p.v.shallow_clone()));
            if p.separate {
                out.push((format!("adamw.master/{}", p.name), p.master.shallow_clone()));
            }
        }
        out
    }

    /// Restores a state written from [`Optimizer::state`] of the same model (read from
    /// `path`, named in errors). Every tensor is checked before any is copied, so a bad file
    /// changes nothing.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] when a tensor is missing or has another shape;
    /// [`Error::Torch`] from the copies.
    pub fn load_state(&mut self, state: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
        let bad = |message: String| Error::Checkpoint {
            path: path.to_path_buf(),
            message,
        };
        let t = state
            .get("adamw.t")
            .ok_or_else(|| bad("optimizer state adamw.t is missing".into()))?
            .f_int64_value(&[0])?;
        let mut sources = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let get = |what: &str, like: &Tensor| -> Result<Tensor> {
                let key = format!("adamw.{what}/{}", p.name);
                let src = state
                    .get(&key)
                    .ok_or_else(|| bad(format!("optimizer state {key} is missing")))?;
                if src.size() != like.size() {
                    return Err(bad(format!(
                        "optimizer state {key} has shape {:?}, the parameter {:?}",
                        src.size(),
                        like.size()
                    )));
                }
                Ok(src.shallow_clone())
            };
            let master = if p.separate {
                Some(get("master", &p.master)?)
            } else {
                None
            };
            sources.push((get("m", &p.m)?, get("v", &p.v)?, master));
        }
        tch::no_grad(|| -> Result<()> {
            for (p, (m, v, master)) in self.params.iter_mut().zip(&sources) {
                let device = p.m.device();
                p.m.f_copy_(&m.f_to_device(device)?.f_to_kind(Kind::Float)?)?;
                p.v.f_copy_(&v.f_to_device(device)?.f_to_kind(Kind::Float)?)?;
                if let Some(master) = master {
                    p.master
                        .f_copy_(&master.f_to_device(device)?.f_to_kind(Kind::Float)?)?;
                }
            }
            Ok(())
        })?;
        self.t = t;
        Ok(())
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
    fn adamw_matches_libtorch_adamw_on_f32_and_bf16_weights() {
        // The same f32 model through libtorch's AdamW (torch.optim.AdamW) and ours, in place
        // and over a separate f32 master: all three step for step the same.
        use tch::nn::OptimizerConfig;
        let cfg = ModelConfig::tiny();
        let a = Model::random(&cfg, 3, Device::Cpu, Kind::Float).unwrap();
        let b = a.deep_copy().unwrap();
        let mut torch = tch::nn::AdamW::default()
            .beta1(0.9)
            .beta2(0.999)
            .wd(0.01)
            .eps(1e-8)
            .build(a.var_store(), 1e-3)
            .unwrap();
        let mut ours = Optimizer::adamw(&b, config(1e-3)).unwrap();
        assert!(
            !ours.has_master_weights(),
            "f32 variables are stepped in place"
        );
        for _ in 0..3 {
            torch.zero_grad();
            fill_grads(&a);
            torch.step();
            ours.zero_grad();
            fill_grads(&b);
            ours.step().unwrap();
        }
        let (va, vb) = (a.var_store().variables(), b.var_store().variables());
        let mut max_diff = 0f64;
        for (name, x) in &va {
            let d = (x - &vb[name]).abs().max().double_value(&[]);
            max_diff = max_diff.max(d);
        }
        assert!(
            max_diff < 1e-6,
            "our AdamW differs from libtorch AdamW by {max_diff}"
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
    fn a_restored_state_continues_exactly_like_an_uninterrupted_run() {
        // Two steps, save the state; a fresh optimizer on a copy of the weights loads it; the
        // next two steps of both give the same weights and state, bit for bit.
        for kind in [Kind::Float, Kind::BFloat16] {
            let cfg = ModelConfig::tiny();
            let a = Model::random(&cfg, 11, Device::Cpu, kind).unwrap();
            let mut first = Optimizer::adamw(&a, config(1e-3)).unwrap();
            for _ in 0..2 {
                first.zero_grad();
                fill_grads(&a);
                first.step().unwrap();
            }
            let saved: HashMap<String, Tensor> = first
                .state()
                .into_iter()
                .map(|(k, t)| (k, t.detach_copy()))
                .collect();
            let b = a.deep_copy().unwrap();
            let mut resumed = Optimizer::adamw(&b, config(1e-3)).unwrap();
            resumed.load_state(&saved, Path::new("state")).unwrap();
            assert_eq!(resumed.t, 2);
            for _ in 0..2 {
                for (m, o) in [(&a, &mut first), (&b, &mut resumed)] {
                    o.zero_grad();
                    fill_grads(m);
                    o.step().unwrap();
                }
            }
            let (va, vb) = (a.var_store().variables(), b.var_store().variables());
            for (name, x) in &va {
                assert!(
                    x.equal(&vb[name]),
                    "{kind:?}: {name} differs after the resume"
                );
            }
            for ((k, x), (_, y)) in first.state().iter().zip(resumed.state().iter()) {
                assert!(x.equal(y), "{kind:?}: state {k} differs after the resume");
            }
            // A state of another shape is refused, and changes nothing.
            let mut wrong: HashMap<String, Tensor> = saved
                .iter()
                .map(|(k, t)| (k.clone(), t.shallow_clone()))
                .collect();
            let (key, t) = wrong
                .iter()
                .find(|(k, _)| k.starts_with("adamw.m/"))
                .map(|(k, t)| (k.clone(), t.shallow_clone()))
                .unwrap();
            wrong.insert(key.clone(), t.reshape([-1]).narrow(0, 0, 1));
            let before: Vec<Tensor> = resumed
                .state()
                .iter()
                .map(|(_, t)| t.detach_copy())
                .collect();
            let e = resumed.load_state(&wrong, Path::new("state")).unwrap_err();
            assert!(e.to_string().contains(&key), "{e}");
            for ((_, now), then) in resumed.state().iter().zip(&before) {
                assert!(now.equal(then), "a refused state changed the optimizer");
            }
        }
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
        opt.config.lr = 1e-4;
        for _ in 0..5 {
            opt.zero_grad();
            fill_grads(&model);
            opt.step().unwrap();
        }
        let norm = opt
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
