//! The optimisers (Adam with optional decoupled weight decay, and RMSProp for the
//! reinforcement-learning presets), the learning-rate schedule and global gradient-norm
//! clipping. lethe owns the optimiser so that its moments are plain named tensors that
//! go into checkpoints (`optim.exp_avg.<param>`, `optim.exp_avg_sq.<param>`).

use tch::Tensor;

use crate::config::{Optimizer, Schedule, TrainConfig};
use crate::error::{LetheError, Result};

/// Adam or RMSProp (`train.optimizer`) over a fixed, named list of parameters.
pub struct Optimiser {
    rule: Optimizer,
    params: Vec<(String, Tensor)>,
    /// The factor on the learning rate of each parameter (its group's).
    lr_scale: Vec<f64>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Updates taken so far (for bias correction).
    pub steps: usize,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

impl Optimiser {
    /// The optimiser of `cfg` over `params` (name, tensor), with its hyper-parameters.
    pub fn new(params: Vec<(String, Tensor)>, cfg: &TrainConfig) -> Self {
        let zeros = |p: &Tensor| p.zeros_like().detach();
        Optimiser {
            rule: cfg.optimizer,
            exp_avg: params.iter().map(|(_, p)| zeros(p)).collect(),
            exp_avg_sq: params.iter().map(|(_, p)| zeros(p)).collect(),
            lr_scale: vec![1.0; params.len()],
            params,
            steps: 0,
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
        }
    }

    /// Puts the parameters for which `member` is true in a group of their own, whose
    /// learning rate is `factor` times the one given to [`Optimiser::step`] (PyTorch's
    /// parameter groups under one schedule). Returns how many parameters it holds.
    pub fn group(&mut self, member: impl Fn(&str) -> bool, factor: f64) -> usize {
        let mut n = 0;
        for ((name, _), scale) in self.params.iter().zip(&mut self.lr_scale) {
            if member(name) {
                *scale = factor;
                n += 1;
            }
        }
        n
    }

    /// Clears every gradient.
    pub fn zero_grad(&mut self) {
        for (_, p) in &mut self.params {
            p.zero_grad();
        }
    }

    /// Global L2 norm of the gradients; when `max > 0` and the norm exceeds it, scales
    /// every gradient down to norm `max`. Returns the norm before clipping.
    pub fn clip_grad_norm(&mut self, max: f64) -> f64 {
        let _guard = tch::no_grad_guard();
        let grads: Vec<Tensor> = self.params.iter().map(|(_, p)| p.grad()).filter(|g| g.defined()).collect();
        let total: f64 = grads.iter().map(|g| g.square().sum(tch::Kind::Double).double_value(&[])).sum::<f64>().sqrt();
        if max > 0.0 && total > max {
            let scale = max / (total + 1e-6);
            for mut g in grads {
                let _ = g.g_mul_scalar_(scale);
            }
        }
        total
    }

    /// One update with learning rate `lr`.
    pub fn step(&mut self, lr: f64) {
        if self.rule == Optimizer::RmsProp {
            return self.rmsprop_step(lr);
        }
        let _guard = tch::no_grad_guard();
        self.steps += 1;
        let t = self.steps as i32;
        let bc1 = 1.0 - self.beta1.powi(t);
        let bc2 = 1.0 - self.beta2.powi(t);
        for (i, (_, p)) in self.params.iter_mut().enumerate() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let lr = lr * self.lr_scale[i];
            let m = &mut self.exp_avg[i];
            let _ = m.g_mul_scalar_(self.beta1);
            let _ = m.g_add_(&(&g * (1.0 - self.beta1)));
            let v = &mut self.exp_avg_sq[i];
            let _ = v.g_mul_scalar_(self.beta2);
            let _ = v.g_add_(&(g.square() * (1.0 - self.beta2)));
            let denom = v.sqrt() / bc2.sqrt() + self.eps;
            let update = &self.exp_avg[i] / denom * (lr / bc1);
            if self.weight_decay > 0.0 {
                let _ = p.g_mul_scalar_(1.0 - lr * self.weight_decay);
            }
            let _ = p.g_sub_(&update);
        }
    }

    /// One RMSProp update: `v = beta2 v + (1 - beta2) g^2`, `p -= lr g / (sqrt(v) + eps)`
    /// (PyTorch's `RMSprop` without momentum or centring). Weight decay is decoupled.
    fn rmsprop_step(&mut self, lr: f64) {
        let _guard = tch::no_grad_guard();
        self.steps += 1;
        for (i, (_, p)) in self.params.iter_mut().enumerate() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let lr = lr * self.lr_scale[i];
            let v = &mut self.exp_avg_sq[i];
            let _ = v.g_mul_scalar_(self.beta2);
            let _ = v.g_add_(&(g.square() * (1.0 - self.beta2)));
            let update = &g / (v.sqrt() + self.eps) * lr;
            if self.weight_decay > 0.0 {
                let _ = p.g_mul_scalar_(1.0 - lr * self.weight_decay);
            }
            let _ = p.g_sub_(&update);
        }
    }

    /// The moments as named tensors, for checkpoints.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.params.len());
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("optim.exp_avg.{name}"), self.exp_avg[i].shallow_clone()));
            out.push((format!("optim.exp_avg_sq.{name}"), self.exp_avg_sq[i].shallow_clone()));
        }
        out
    }

    /// Restores moments saved by [`Optimiser::state`]; `find` looks a tensor up by name.
    pub fn load_state(&mut self, steps: usize, find: impl Fn(&str) -> Option<Tensor>) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (i, (name, p)) in self.params.iter().enumerate() {
            for (kind, slot) in [("exp_avg", &mut self.exp_avg[i]), ("exp_avg_sq", &mut self.exp_avg_sq[i])] {
                let key = format!("optim.{kind}.{name}");
                let t = find(&key).ok_or_else(|| LetheError::Invalid(format!("missing optimiser tensor `{key}`")))?;
                if t.size() != p.size() {
                    return Err(LetheError::Invalid(format!(
                        "optimiser tensor `{key}` has shape {:?}, the parameter has {:?}",
                        t.size(),
                        p.size()
                    )));
                }
                slot.copy_(&t.to_device(p.device()).to_kind(p.kind()));
            }
        }
        self.steps = steps;
        Ok(())
    }
}

/// Learning rate at optimiser step `step` (0-based): linear warm-up to `lr`, then
/// cosine decay to `lr * min_lr_ratio` at the last step, or constant.
pub fn learning_rate(cfg: &TrainConfig, step: usize) -> f64 {
    if step < cfg.warmup {
        return cfg.lr * (step + 1) as f64 / cfg.warmup as f64;
    }
    match cfg.schedule {
        Schedule::Constant => cfg.lr,
        Schedule::Cosine | Schedule::Linear => {
            let span = cfg.steps.saturating_sub(cfg.warmup).max(1) as f64;
            let progress = ((step - cfg.warmup) as f64 / span).min(1.0);
            let min = cfg.lr * cfg.min_lr_ratio;
            let left = match cfg.schedule {
                Schedule::Linear => 1.0 - progress,
                _ => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
            };
            min + (cfg.lr - min) * left
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    #[test]
    fn schedule_warms_up_linearly_then_decays_to_the_floor() {
        let cfg = TrainConfig { lr: 1.0, warmup: 10, steps: 110, min_lr_ratio: 0.1, ..TrainConfig::default() };
        assert!((learning_rate(&cfg, 0) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&cfg, 9) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&cfg, 10) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&cfg, 60) - 0.55).abs() < 1e-12);
        assert!((learning_rate(&cfg, 110) - 0.1).abs() < 1e-12);
        let constant = TrainConfig { schedule: Schedule::Constant, ..cfg.clone() };
        assert_eq!(learning_rate(&constant, 80), 1.0);
        let linear = TrainConfig { schedule: Schedule::Linear, ..cfg };
        assert!((learning_rate(&linear, 60) - 0.55).abs() < 1e-12 && (learning_rate(&linear, 35) - 0.775).abs() < 1e-12);
        assert!((learning_rate(&linear, 110) - 0.1).abs() < 1e-12);
    }

    /// Two Adam steps on f(p) = sum(p^2) / 2 (gradient = p), against the formulas by hand.
    #[test]
    fn adam_matches_hand_computed_updates() {
        let p = Tensor::from_slice(&[1.0f64, -2.0]).set_requires_grad(true);
        let cfg = TrainConfig { beta1: 0.9, beta2: 0.999, eps: 0.0, ..TrainConfig::default() };
        let mut adam = Optimiser::new(vec![("p".into(), p.shallow_clone())], &cfg);
        let (mut m, mut v, mut x) = ([0.0f64; 2], [0.0f64; 2], [1.0f64, -2.0]);
        for t in 1..=2 {
            adam.zero_grad();
            (p.square().sum(Kind::Double) / 2.0).backward();
            adam.step(0.1);
            for i in 0..2 {
                let g = x[i];
                m[i] = 0.9 * m[i] + 0.1 * g;
                v[i] = 0.999 * v[i] + 0.001 * g * g;
                let mh = m[i] / (1.0 - 0.9f64.powi(t));
                let vh = v[i] / (1.0 - 0.999f64.powi(t));
                x[i] -= 0.1 * mh / vh.sqrt();
            }
        }
        let got: Vec<f64> = p.detach().try_into().unwrap();
        for i in 0..2 {
            assert!((got[i] - x[i]).abs() < 1e-12, "{got:?} vs {x:?}");
        }
    }

    /// Two RMSProp steps on f(p) = sum(p^2) / 2, against the formulas by hand.
    #[test]
    fn rmsprop_matches_hand_computed_updates() {
        let p = Tensor::from_slice(&[1.0f64, -2.0]).set_requires_grad(true);
        let cfg = TrainConfig { beta2: 0.99, eps: 1e-5, optimizer: Optimizer::RmsProp, ..TrainConfig::default() };
        let mut opt = Optimiser::new(vec![("p".into(), p.shallow_clone())], &cfg);
        let (mut v, mut x) = ([0.0f64; 2], [1.0f64, -2.0]);
        for _ in 0..2 {
            opt.zero_grad();
            (p.square().sum(Kind::Double) / 2.0).backward();
            opt.step(0.01);
            for i in 0..2 {
                let g = x[i];
                v[i] = 0.99 * v[i] + 0.01 * g * g;
                x[i] -= 0.01 * g / (v[i].sqrt() + 1e-5);
            }
        }
        let got: Vec<f64> = p.detach().try_into().unwrap();
        for i in 0..2 {
            assert!((got[i] - x[i]).abs() < 1e-12, "{got:?} vs {x:?}");
        }
    }

    /// Two groups, the second at 5 times the rate: with equal gradients Adam's first
    /// update is `lr` per parameter (the normalised moment is 1), so it is 5 times larger.
    #[test]
    fn a_group_steps_at_its_own_learning_rate() {
        let a = Tensor::from_slice(&[1.0f64]).set_requires_grad(true);
        let b = Tensor::from_slice(&[1.0f64]).set_requires_grad(true);
        let cfg = TrainConfig { eps: 0.0, ..TrainConfig::default() };
        let mut adam = Optimiser::new(vec![("layers.0.ff1.weight".into(), a.shallow_clone()), ("layers.0.attn.ltm.k".into(), b.shallow_clone())], &cfg);
        assert_eq!(adam.group(|n| n.contains(".ltm."), 5.0), 1);
        ((&a + &b).sum(Kind::Double)).backward();
        adam.step(0.01);
        let (a, b) = (a.double_value(&[0]), b.double_value(&[0]));
        assert!((1.0 - a - 0.01).abs() < 1e-12 && (1.0 - b - 0.05).abs() < 1e-12, "{a} {b}");
    }

    #[test]
    fn clipping_scales_the_global_norm() {
        let p = Tensor::from_slice(&[3.0f64, 4.0]).set_requires_grad(true);
        let mut adam = Optimiser::new(vec![("p".into(), p.shallow_clone())], &TrainConfig::default());
        (p.square().sum(Kind::Double) / 2.0).backward(); // grad = (3, 4), norm 5
        let norm = adam.clip_grad_norm(1.0);
        assert!((norm - 5.0).abs() < 1e-12);
        let g: Vec<f64> = p.grad().try_into().unwrap();
        assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6, "{g:?}");
    }
}
