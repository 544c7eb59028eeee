//! The optimisers (Adam with optional decoupled weight decay, and RMSProp for the
//! reinforcement-learning presets), the learning-rate schedule and global gradient-norm
//! clipping. lethe owns the optimiser so that its moments are plain named tensors that
//! go into checkpoints (`optim.exp_avg.<param>`, `optim.exp_avg_sq.<param>`). On the CPU
//! the update of every parameter is one call into `csrc/adam.cpp`, bitwise the
//! libtorch operations it replaces.

use std::ffi::{c_int, c_void};

use tch::Tensor;

use crate::config::{Optimizer, Schedule, TrainConfig};
use crate::error::{LetheError, Result};
use crate::loss_scale::LossScale;
use lethe_kernels::{lethe_clip_foreach, lethe_optimiser_step, raw, OptimiserArgs};

/// The checkpoint's name of float16 training's loss scale and its count of good steps.
const LOSS_SCALE_KEY: &str = "optim.loss_scale";

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
    /// Float16 training's dynamic loss scale (`train.precision = "f16"`), else `None`.
    pub loss_scale: Option<LossScale>,
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
            loss_scale: (cfg.precision == crate::config::Precision::F16).then(LossScale::default),
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

    /// Number of scalar parameters it updates.
    pub fn parameter_count(&self) -> usize {
        self.params.iter().map(|(_, p)| p.numel()).sum()
    }

    /// Clears every gradient.
    pub fn zero_grad(&mut self) {
        for (_, p) in &mut self.params {
            p.zero_grad();
        }
    }

    /// The gradients the last backward pass left (parameters without one left out).
    fn grads(&self) -> Vec<Tensor> {
        self.params.iter().map(|(_, p)| p.grad()).filter(|g| g.defined()).collect()
    }

    /// Multiplies every gradient by `factor` (float16 training divides out its loss
    /// scale before the clip).
    pub fn scale_grads(&mut self, factor: f64) {
        let _guard = tch::no_grad_guard();
        for mut g in self.grads() {
            let _ = g.g_mul_scalar_(factor);
        }
    }

    /// Global L2 norm of the gradients; when `max > 0` and the norm exceeds it, scales
    /// every gradient down to norm `max`. Returns the norm before clipping. On a GPU
    /// with one read back to the host for all the gradients ([`clip_foreach`]);
    /// on the CPU one sum per gradient, as the figures lethe published were computed.
    pub fn clip_grad_norm(&mut self, max: f64) -> Result<f64> {
        let _guard = tch::no_grad_guard();
        let grads = self.grads();
        if grads.first().is_some_and(|g| g.device() != tch::Device::Cpu) {
            return clip_foreach(&grads, max);
        }
        let total: f64 = grads.iter().map(|g| g.square().sum(tch::Kind::Double).double_value(&[])).sum::<f64>().sqrt();
        if max > 0.0 && total > max {
            self.scale_grads(max / (total + 1e-6));
        }
        Ok(total)
    }

    /// One update with learning rate `lr`: on the CPU one call into `csrc/adam.cpp`
    /// for every parameter ([`Optimiser::step_many`]), on a GPU libtorch's multi-tensor
    /// operations for every parameter (the same call, `multi_tensor`), and libtorch
    /// operations per parameter for the rest ([`Optimiser::step_tensors`]: CPU tensors
    /// of other types or layouts); the first and the last give the same bits.
    pub fn step(&mut self, lr: f64) -> Result<()> {
        let _guard = tch::no_grad_guard();
        self.steps += 1;
        let (fused, rest): (Vec<usize>, Vec<usize>) =
            (0..self.params.len()).filter(|&i| self.params[i].1.grad().defined()).partition(|&i| self.fusable(i));
        let (on_gpu, rest): (Vec<usize>, Vec<usize>) =
            rest.into_iter().partition(|&i| self.params[i].1.device() != tch::Device::Cpu);
        self.step_many(&fused, lr, false)?;
        self.step_many(&on_gpu, lr, true)?;
        for i in rest {
            self.step_tensors(i, lr);
        }
        Ok(())
    }

    /// Bias corrections `(1 - beta1^t, 1 - beta2^t)` of the step taken.
    fn bias_corrections(&self) -> (f64, f64) {
        let t = self.steps as i32;
        (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t))
    }

    /// Whether parameter `i` can take the fused update: it and its moments contiguous
    /// float or double CPU tensors.
    fn fusable(&self, i: usize) -> bool {
        let p = &self.params[i].1;
        let ok = |t: &Tensor| t.device() == tch::Device::Cpu && t.is_contiguous() && t.kind() == p.kind();
        matches!(p.kind(), tch::Kind::Float | tch::Kind::Double)
            && ok(p)
            && ok(&self.exp_avg[i])
            && ok(&self.exp_avg_sq[i])
    }

    /// The update of parameters `which` in one call into `csrc/adam.cpp`: each element
    /// through the operations of [`Optimiser::step_tensors`] in the same order, with the
    /// constants rounded as libtorch rounds them, so the same bits without the dozen
    /// passes and temporaries per parameter (CPU tensors); with `multi_tensor`, the same
    /// update as libtorch's multi-tensor operations (any device; a GPU's path).
    fn step_many(&mut self, which: &[usize], lr: f64, multi_tensor: bool) -> Result<()> {
        if which.is_empty() {
            return Ok(());
        }
        let (bc1, bc2) = self.bias_corrections();
        let rmsprop = self.rule == Optimizer::RmsProp;
        let rate = |i: usize| lr * self.lr_scale[i];
        let steps: Vec<f64> = which.iter().map(|&i| if rmsprop { rate(i) } else { rate(i) / bc1 }).collect();
        let decays: Vec<f64> = which.iter().map(|&i| 1.0 - rate(i) * self.weight_decay).collect();
        let constants = [self.beta1, 1.0 - self.beta1, self.beta2, 1.0 - self.beta2, bc2.sqrt(), self.eps];
        let grads: Vec<Tensor> = which.iter().map(|&i| self.params[i].1.grad()).collect();
        let ptrs = |ts: Vec<&Tensor>| ts.into_iter().map(raw).collect::<Vec<_>>();
        let mut params = ptrs(which.iter().map(|&i| &self.params[i].1).collect());
        let mut grad_ptrs = ptrs(grads.iter().collect());
        let mut exp_avg = ptrs(which.iter().map(|&i| &self.exp_avg[i]).collect());
        let mut exp_avg_sq = ptrs(which.iter().map(|&i| &self.exp_avg_sq[i]).collect());
        // SAFETY: every pointer is a live `at::Tensor*` owned by `self` or `grads` for the
        // call; the kernel writes the parameters' and moments' storage in place and keeps
        // no pointer; the arrays are `which.len()` long, `constants` 6.
        lethe_kernels::call("optimiser step", |error| unsafe {
            let args = OptimiserArgs {
                params: params.as_mut_ptr(),
                grads: grad_ptrs.as_mut_ptr(),
                exp_avg: exp_avg.as_mut_ptr(),
                exp_avg_sq: exp_avg_sq.as_mut_ptr(),
                count: which.len() as i64,
                steps: steps.as_ptr(),
                decays: decays.as_ptr(),
                constants: constants.as_ptr(),
                rmsprop: c_int::from(rmsprop),
                decay: c_int::from(self.weight_decay > 0.0),
                multi_tensor: c_int::from(multi_tensor),
            };
            lethe_optimiser_step(&args, error)
        })?;
        Ok(())
    }

    /// The update of parameter `i` as libtorch operations (the path for other devices,
    /// and the reference the fused one is tested against).
    fn step_tensors(&mut self, i: usize, lr: f64) {
        let g = self.params[i].1.grad();
        let lr = lr * self.lr_scale[i];
        let update = match self.rule {
            Optimizer::Adam => {
                let (bc1, bc2) = self.bias_corrections();
                let m = &mut self.exp_avg[i];
                let _ = m.g_mul_scalar_(self.beta1);
                let _ = m.g_add_(&(&g * (1.0 - self.beta1)));
                let v = &mut self.exp_avg_sq[i];
                let _ = v.g_mul_scalar_(self.beta2);
                let _ = v.g_add_(&(g.square() * (1.0 - self.beta2)));
                let denom = v.sqrt() / bc2.sqrt() + self.eps;
                &self.exp_avg[i] / denom * (lr / bc1)
            }
            // RMSProp: `v = beta2 v + (1 - beta2) g^2`, `p -= lr g / (sqrt(v) + eps)`
            // (PyTorch's `RMSprop` without momentum or centring).
            Optimizer::RmsProp => {
                let v = &mut self.exp_avg_sq[i];
                let _ = v.g_mul_scalar_(self.beta2);
                let _ = v.g_add_(&(g.square() * (1.0 - self.beta2)));
                &g / (v.sqrt() + self.eps) * lr
            }
        };
        let p = &mut self.params[i].1;
        if self.weight_decay > 0.0 {
            let _ = p.g_mul_scalar_(1.0 - lr * self.weight_decay);
        }
        let _ = p.g_sub_(&update);
    }

    /// The moments as named tensors, for checkpoints.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.params.len());
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("optim.exp_avg.{name}"), self.exp_avg[i].shallow_clone()));
            out.push((format!("optim.exp_avg_sq.{name}"), self.exp_avg_sq[i].shallow_clone()));
        }
        if let Some(s) = self.loss_scale {
            out.push((LOSS_SCALE_KEY.to_string(), Tensor::from_slice(&[s.scale, s.good_steps as f64])));
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
        // A float16 run resumes at its scale; one whose checkpoint has none (it trained
        // in another precision until now) starts at the initial scale.
        if let (Some(scale), Some(t)) = (self.loss_scale.as_mut(), find(LOSS_SCALE_KEY)) {
            let bad = || LetheError::Invalid(format!("optimiser tensor `{LOSS_SCALE_KEY}` is not a scale and a count"));
            let v = Vec::<f64>::try_from(&t.to_kind(tch::Kind::Double)).map_err(|_| bad())?;
            match v[..] {
                [s, good] if s.is_finite() && s > 0.0 && good >= 0.0 => {
                    *scale = LossScale { scale: s, good_steps: good as usize }
                }
                _ => return Err(bad()),
            }
        }
        Ok(())
    }
}

/// [`Optimiser::clip_grad_norm`] on a GPU: `csrc/adam.cpp`'s `lethe_clip_foreach`.
fn clip_foreach(grads: &[Tensor], max: f64) -> Result<f64> {
    let mut ptrs: Vec<*mut c_void> = grads.iter().map(raw).collect();
    let mut norm = 0.0;
    // SAFETY: every pointer is a live `at::Tensor*` of `grads` for the call; the function
    // scales their storage in place, keeps no pointer and writes one double to `norm`.
    lethe_kernels::call("gradient clipping", |error| unsafe {
        lethe_clip_foreach(ptrs.as_mut_ptr(), ptrs.len() as i64, max, &mut norm, error)
    })?;
    Ok(norm)
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
        assert!(
            (learning_rate(&linear, 60) - 0.55).abs() < 1e-12 && (learning_rate(&linear, 35) - 0.775).abs() < 1e-12
        );
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
            adam.step(0.1).unwrap();
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
            opt.step(0.01).unwrap();
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

    /// Float16 training's loss scale goes into the checkpoint and comes back on resume;
    /// another precision's checkpoint leaves it at its start; a damaged one is refused.
    #[test]
    fn the_loss_scale_is_saved_and_restored() {
        let p = Tensor::ones([2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let cfg = TrainConfig { precision: crate::config::Precision::F16, ..TrainConfig::default() };
        let mut opt = Optimiser::new(vec![("p".into(), p.shallow_clone())], &cfg);
        opt.loss_scale = Some(LossScale { scale: 1024.0, good_steps: 7 });
        let saved = opt.state();
        let find = |name: &str| saved.iter().find(|(n, _)| n == name).map(|(_, t)| t.shallow_clone());
        let mut resumed = Optimiser::new(vec![("p".into(), p.shallow_clone())], &cfg);
        resumed.load_state(3, find).unwrap();
        assert_eq!(resumed.loss_scale, Some(LossScale { scale: 1024.0, good_steps: 7 }));
        let f32_state = Optimiser::new(vec![("p".into(), p.shallow_clone())], &TrainConfig::default()).state();
        assert!(f32_state.iter().all(|(n, _)| n != LOSS_SCALE_KEY));
        let find = |name: &str| f32_state.iter().find(|(n, _)| n == name).map(|(_, t)| t.shallow_clone());
        let mut switched = Optimiser::new(vec![("p".into(), p.shallow_clone())], &cfg);
        switched.load_state(3, find).unwrap();
        assert_eq!(switched.loss_scale, Some(LossScale::default()));
        let bad = Tensor::from_slice(&[f64::NAN, 1.0]);
        let find = |name: &str| if name == LOSS_SCALE_KEY { Some(bad.shallow_clone()) } else { find(name) };
        let e = switched.load_state(3, find).unwrap_err().to_string();
        assert!(e.contains(LOSS_SCALE_KEY), "{e}");
    }

    /// Two groups, the second at 5 times the rate: with equal gradients Adam's first
    /// update is `lr` per parameter (the normalised moment is 1), so it is 5 times larger.
    #[test]
    fn a_group_steps_at_its_own_learning_rate() {
        let a = Tensor::from_slice(&[1.0f64]).set_requires_grad(true);
        let b = Tensor::from_slice(&[1.0f64]).set_requires_grad(true);
        let cfg = TrainConfig { eps: 0.0, ..TrainConfig::default() };
        let mut adam = Optimiser::new(
            vec![("layers.0.ff1.weight".into(), a.shallow_clone()), ("layers.0.attn.ltm.k".into(), b.shallow_clone())],
            &cfg,
        );
        assert_eq!(adam.group(|n| n.contains(".ltm."), 5.0), 1);
        ((&a + &b).sum(Kind::Double)).backward();
        adam.step(0.01).unwrap();
        let (a, b) = (a.double_value(&[0]), b.double_value(&[0]));
        assert!((1.0 - a - 0.01).abs() < 1e-12 && (1.0 - b - 0.05).abs() < 1e-12, "{a} {b}");
    }

    /// Parameters of the given shapes (the first in a group at twice the rate), and their
    /// copies, with seeded values.
    fn twin_params(kind: Kind, seed: u64) -> [Vec<(String, Tensor)>; 2] {
        let mut rng = crate::rng::Rng::new(seed);
        let shapes: [&[i64]; 4] = [&[3, 5], &[7], &[40, 1000], &[1]];
        let made: Vec<Tensor> = shapes.iter().map(|s| rng.normal_tensor(s, kind)).collect();
        let named = |copy: bool| {
            made.iter()
                .enumerate()
                .map(|(i, t)| {
                    (format!("p{i}"), if copy { t.detach().copy() } else { t.shallow_clone() }.set_requires_grad(true))
                })
                .collect()
        };
        [named(false), named(true)]
    }

    fn shallow(params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
        params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect()
    }

    /// Gradients of a seeded random linear function of the parameters, the same for both
    /// sets: `p1`'s is zero on odd steps, `p3` never has one (a parameter no loss reaches).
    /// Two copies of the [`twin_params`] (seed 7) and an optimiser of `rule` over each,
    /// `p0` in a group at twice the rate.
    fn twin_optimisers(kind: Kind, rule: Optimizer, decay: f64) -> ([Vec<(String, Tensor)>; 2], Optimiser, Optimiser) {
        let [a, b] = twin_params(kind, 7);
        let cfg =
            TrainConfig { optimizer: rule, weight_decay: decay, beta2: 0.98, eps: 1e-6, ..TrainConfig::default() };
        let (mut first, mut second) = (Optimiser::new(shallow(&a), &cfg), Optimiser::new(shallow(&b), &cfg));
        for opt in [&mut first, &mut second] {
            assert_eq!(opt.group(|n| n == "p0", 2.0), 1);
        }
        ([a, b], first, second)
    }

    fn set_grads(a: &[(String, Tensor)], b: &[(String, Tensor)], step: u64) {
        let mut rng = crate::rng::Rng::new(100 + step);
        for (i, ((_, pa), (_, pb))) in a.iter().zip(b).enumerate() {
            if i == 3 || (i == 1 && step % 2 == 1) {
                continue;
            }
            let w = rng.normal_tensor(&pa.size(), pa.kind()) * (0.1 + step as f64);
            (pa * &w).sum(pa.kind()).backward();
            (pb * &w).sum(pb.kind()).backward();
        }
    }

    /// The fused update (`csrc/adam.cpp`) writes bitwise what the libtorch operations
    /// write, for Adam and RMSProp, with and without weight decay, with a parameter
    /// group, in float and double, with a zero gradient and a parameter without one.
    /// The GPU's path, run on the CPU (libtorch's `_foreach_` operations have CPU
    /// kernels too): the multi-tensor update follows the per-parameter operations to
    /// float rounding over four steps, with a group at twice the rate and weight decay,
    /// and its clipping gives the CPU's norm and scale.
    #[test]
    fn the_multi_tensor_update_and_clipping_follow_the_per_parameter_ones() {
        for (rule, decay) in [(Optimizer::Adam, 0.01), (Optimizer::RmsProp, 0.0)] {
            let ([a, b], mut multi, mut plain) = twin_optimisers(Kind::Float, rule, decay);
            for step in 0..4 {
                multi.zero_grad();
                plain.zero_grad();
                set_grads(&a, &b, step);
                let (norm, plain_norm) =
                    (clip_foreach(&multi.grads(), 0.5).unwrap(), plain.clip_grad_norm(0.5).unwrap());
                assert!(
                    (norm - plain_norm).abs() <= 1e-6 * plain_norm && norm > 0.5,
                    "{rule:?}: norm {norm} against {plain_norm}"
                );
                let lr = 0.01 / (1 + step) as f64;
                let _guard = tch::no_grad_guard();
                for opt in [&mut multi, &mut plain] {
                    opt.steps += 1;
                }
                let with_grad: Vec<usize> = (0..3).collect();
                multi.step_many(&with_grad, lr, true).unwrap();
                for &i in &with_grad {
                    plain.step_tensors(i, lr);
                }
            }
            let [start, _] = twin_params(Kind::Float, 7);
            for (((name, pa), (_, pb)), (_, p0)) in a.iter().zip(&b).zip(&start).take(3) {
                let (moved, gap) = ((pb - p0).abs().max().double_value(&[]), (pa - pb).abs().max().double_value(&[]));
                // A wrong update (a missing bias correction, the wrong rate) would differ
                // by a good part of the move; rounding by a unit in the last place of p.
                assert!(moved > 1e-3 && gap <= 1e-4 * moved, "{rule:?}: {name} moved {moved}, the two differ by {gap}");
            }
            for ((name, ma), (_, mb)) in multi.state().iter().zip(&plain.state()).filter(|(s, _)| !s.0.ends_with("p3"))
            {
                let gap = (ma - mb).abs().max().double_value(&[]) / mb.abs().max().double_value(&[]).max(1e-30);
                assert!(gap <= 1e-5, "{rule:?}: {name} differs by {gap:.2e} of its largest entry");
            }
        }
    }

    #[test]
    fn the_fused_update_equals_the_libtorch_operations_bitwise() {
        for (kind, rule, decay) in [
            (Kind::Float, Optimizer::Adam, 0.0),
            (Kind::Float, Optimizer::Adam, 0.01),
            (Kind::Double, Optimizer::Adam, 0.1),
            (Kind::Float, Optimizer::RmsProp, 0.0),
            (Kind::Double, Optimizer::RmsProp, 0.01),
        ] {
            let ([a, b], mut fused, mut plain) = twin_optimisers(kind, rule, decay);
            for step in 0..4 {
                fused.zero_grad();
                plain.zero_grad();
                set_grads(&a, &b, step);
                let lr = 0.01 / (1 + step) as f64;
                fused.step(lr).unwrap();
                let _guard = tch::no_grad_guard();
                plain.steps += 1;
                for i in 0..plain.params.len() {
                    if plain.params[i].1.grad().defined() {
                        plain.step_tensors(i, lr);
                    }
                }
            }
            let bits = |t: &Tensor| -> Vec<u64> {
                let v: Vec<f64> = t.to_kind(Kind::Double).flatten(0, -1).try_into().unwrap();
                v.iter().map(|x| x.to_bits()).collect()
            };
            for ((name, pa), (_, pb)) in a.iter().zip(&b) {
                assert!(bits(pa) == bits(pb), "{kind:?} {rule:?} decay {decay}: parameter {name} differs");
            }
            for (sa, sb) in fused.state().iter().zip(&plain.state()) {
                assert!(bits(&sa.1) == bits(&sb.1), "{kind:?} {rule:?} decay {decay}: {} differs", sa.0);
            }
            // The update moved every parameter with a gradient, and only those.
            let [start, _] = twin_params(kind, 7);
            let moved: Vec<bool> = a.iter().zip(&start).map(|((_, x), (_, y))| bits(x) != bits(y)).collect();
            assert_eq!(moved, [true, true, true, false], "{kind:?} {rule:?}");
        }
    }

    #[test]
    fn clipping_scales_the_global_norm() {
        let p = Tensor::from_slice(&[3.0f64, 4.0]).set_requires_grad(true);
        let mut adam = Optimiser::new(vec![("p".into(), p.shallow_clone())], &TrainConfig::default());
        (p.square().sum(Kind::Double) / 2.0).backward(); // grad = (3, 4), norm 5
        let norm = adam.clip_grad_norm(1.0).unwrap();
        assert!((norm - 5.0).abs() < 1e-12);
        let g: Vec<f64> = p.grad().try_into().unwrap();
        assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6, "{g:?}");
    }
}
