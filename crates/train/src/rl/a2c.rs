//! Advantage actor-critic (Mnih et al., 2016), as the Expire-Span paper trains its
//! gridworld agents (A.3.1): n-step discounted returns over a truncation window,
//! bootstrapped from the critic at the window's end, and the loss
//!
//! `L = -mean(log π(a_t|s_t) A_t) + c_v mean(½ (R_t - V(s_t))²) - c_e mean(H(π(·|s_t)))`
//!
//! with `A_t = R_t - V(s_t)` held constant, means over the steps where an episode was
//! running, `c_v = rl.value_coef` and `c_e = rl.entropy_coef`.

use tch::{Kind, Tensor};

use super::RlConfig;

/// One truncation window of a batch of episodes, time-major (`[t][b]`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rollout {
    /// The action taken at each step.
    pub actions: Vec<Vec<i64>>,
    /// The reward of each step.
    pub rewards: Vec<Vec<f64>>,
    /// Whether the episode ended with this step.
    pub ends: Vec<Vec<bool>>,
    /// Whether the episode was running before this step (the step counts).
    pub active: Vec<Vec<bool>>,
}

impl Rollout {
    /// Steps in the window.
    pub fn len(&self) -> usize {
        self.actions.len()
    }

    /// Whether the window holds no step.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// Steps where an episode was running.
    pub fn active_steps(&self) -> usize {
        self.active.iter().flatten().filter(|&&a| a).count()
    }

    /// The window of episodes `lo..hi` alone (a data-parallel rank's rows).
    pub fn rows(&self, lo: usize, hi: usize) -> Rollout {
        fn cut<T: Clone>(steps: &[Vec<T>], lo: usize, hi: usize) -> Vec<Vec<T>> {
            steps.iter().map(|s| s[lo..hi].to_vec()).collect()
        }
        Rollout {
            actions: cut(&self.actions, lo, hi),
            rewards: cut(&self.rewards, lo, hi),
            ends: cut(&self.ends, lo, hi),
            active: cut(&self.active, lo, hi),
        }
    }
}

/// Discounted returns `R_t = r_t + γ (1 - end_t) R_{t+1}`, `[t][b]`, starting from
/// `R_T = bootstrap[b]` (the critic's value of the state after the window; it does not
/// count for an episode that ended inside the window). Steps where the episode was not
/// running get 0.
pub fn returns(rollout: &Rollout, bootstrap: &[f64], gamma: f64) -> Vec<Vec<f64>> {
    let mut next = bootstrap.to_vec();
    let mut out = vec![vec![0.0; bootstrap.len()]; rollout.len()];
    for t in (0..rollout.len()).rev() {
        for b in 0..bootstrap.len() {
            let carry = if rollout.ends[t][b] { 0.0 } else { gamma * next[b] };
            next[b] = rollout.rewards[t][b] + carry;
            out[t][b] = if rollout.active[t][b] { next[b] } else { 0.0 };
        }
    }
    out
}

/// Advantages `A_t = R_t - V(s_t)`, `[t][b]`, 0 where the episode was not running.
/// `values` is `[t][b]`.
pub fn advantages(rollout: &Rollout, returns: &[Vec<f64>], values: &[Vec<f64>]) -> Vec<Vec<f64>> {
    (0..rollout.len())
        .map(|t| {
            (0..returns[t].len())
                .map(|b| if rollout.active[t][b] { returns[t][b] - values[t][b] } else { 0.0 })
                .collect()
        })
        .collect()
}

/// The loss of one window and its parts (means over the running steps).
pub struct Loss {
    /// The loss to minimise (without the memories' auxiliary loss).
    pub total: Tensor,
    /// The policy-gradient term.
    pub policy: f64,
    /// `½ (R - V)²`.
    pub value: f64,
    /// Mean entropy of the policy, nats.
    pub entropy: f64,
}

/// The actor-critic loss. `logits` `(b, T, 4)` and `values` `(b, T)` come from the
/// agent; `returns` `[t][b]` from [`returns`].
pub fn loss(logits: &Tensor, values: &Tensor, rollout: &Rollout, returns: &[Vec<f64>], cfg: &RlConfig) -> Loss {
    loss_over(logits, values, rollout, returns, cfg, rollout.active_steps().max(1) as f64)
}

/// [`loss`] with the means taken over `count` running steps: a data-parallel rank
/// passes its own rows and the whole batch's count, so that the ranks' losses (and
/// gradients) add up to the whole batch's.
pub fn loss_over(
    logits: &Tensor,
    values: &Tensor,
    rollout: &Rollout,
    returns: &[Vec<f64>],
    cfg: &RlConfig,
    count: f64,
) -> Loss {
    let (b, t) = (values.size()[0], values.size()[1]);
    let device = values.device();
    let batch_major = |rows: Vec<f32>| Tensor::from_slice(&rows).view([t, b]).transpose(0, 1).to_device(device); // (b, T)
    let flat = |f: &dyn Fn(usize, usize) -> f32| {
        (0..t as usize).flat_map(|i| (0..b as usize).map(move |j| (i, j))).map(|(i, j)| f(i, j)).collect::<Vec<f32>>()
    };
    let mask = batch_major(flat(&|i, j| if rollout.active[i][j] { 1.0 } else { 0.0 }));
    let target = batch_major(flat(&|i, j| returns[i][j] as f32));
    let actions = Tensor::from_slice(&(0..t as usize).flat_map(|i| rollout.actions[i].clone()).collect::<Vec<i64>>())
        .view([t, b])
        .transpose(0, 1)
        .to_device(device); // (b, T)
    let logp = logits.log_softmax(-1, Kind::Float); // (b, T, 4)
    let taken = logp.gather(-1, &actions.unsqueeze(-1), false).squeeze_dim(-1); // (b, T)
    let advantage = (&target - values).detach();
    let policy = -(taken * &advantage * &mask).sum(Kind::Float) / count;
    let value = ((&target - values).square() * &mask).sum(Kind::Float) * 0.5 / count;
    let entropy = (-(logp.exp() * &logp).sum_dim_intlist([-1i64].as_slice(), false, Kind::Float) * &mask)
        .sum(Kind::Float)
        / count;
    let total = &policy + &value * cfg.value_coef - &entropy * cfg.entropy_coef;
    Loss { policy: policy.double_value(&[]), value: value.double_value(&[]), entropy: entropy.double_value(&[]), total }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two episodes over three steps: the first ends at step 1 with reward 1 and waits;
    /// the second runs on and is cut by the window.
    fn rollout() -> Rollout {
        Rollout {
            actions: vec![vec![0, 1], vec![2, 3], vec![0, 0]],
            rewards: vec![vec![0.0, 0.5], vec![1.0, 0.0], vec![0.0, 2.0]],
            ends: vec![vec![false, false], vec![true, false], vec![false, false]],
            active: vec![vec![true, true], vec![true, true], vec![false, true]],
        }
    }

    #[test]
    fn returns_discount_stop_at_episode_ends_and_bootstrap_the_cut() {
        let r = returns(&rollout(), &[10.0, 4.0], 0.5);
        // Episode 0: R1 = 1 (it ended: no bootstrap), R0 = 0 + 0.5 * 1; step 2 does not count.
        // Episode 1: R2 = 2 + 0.5 * 4 = 4, R1 = 0 + 0.5 * 4 = 2, R0 = 0.5 + 0.5 * 2 = 1.5.
        assert_eq!(r, vec![vec![0.5, 1.5], vec![1.0, 2.0], vec![0.0, 4.0]]);
    }

    #[test]
    fn advantages_are_returns_minus_values_on_running_steps() {
        let ro = rollout();
        let r = returns(&ro, &[10.0, 4.0], 0.5);
        let a = advantages(&ro, &r, &[vec![0.25, 1.0], vec![0.5, 3.0], vec![7.0, 1.0]]);
        assert_eq!(a, vec![vec![0.25, 0.5], vec![0.5, -1.0], vec![0.0, 3.0]]);
    }

    #[test]
    fn the_loss_matches_a_hand_computation() {
        let ro = rollout();
        let r = returns(&ro, &[10.0, 4.0], 0.5);
        // Uniform logits: log π = -ln 4 for every action, entropy ln 4.
        let logits = Tensor::zeros([2, 3, 4], (Kind::Float, tch::Device::Cpu));
        let values = Tensor::from_slice(&[0.25f32, 0.5, 7.0, 1.0, 3.0, 1.0]).view([2, 3]).set_requires_grad(true);
        let cfg = RlConfig { value_coef: 0.5, entropy_coef: 0.01, ..RlConfig::default() };
        let l = loss(&logits, &values, &ro, &r, &cfg);
        let adv = [0.25, 0.5, 0.5, -1.0, 3.0]; // the five running steps
        let ln4 = 4f64.ln();
        let policy = adv.iter().map(|a| ln4 * a).sum::<f64>() / 5.0;
        let value = adv.iter().map(|a| 0.5 * a * a).sum::<f64>() / 5.0;
        assert!((l.policy - policy).abs() < 1e-5, "{} vs {policy}", l.policy);
        assert!((l.value - value).abs() < 1e-5, "{} vs {value}", l.value);
        assert!((l.entropy - ln4).abs() < 1e-5);
        let total = policy + 0.5 * value - 0.01 * ln4;
        assert!((l.total.double_value(&[]) - total).abs() < 1e-5);
        // The critic's gradient is -c_v (R - V) / count on running steps, 0 elsewhere.
        l.total.backward();
        let g: Vec<f32> = values.grad().view([-1]).try_into().unwrap();
        let want = [-0.25, -0.5, 0.0, -0.5, 1.0, -3.0].map(|a: f64| 0.5 * a / 5.0);
        for (got, want) in g.iter().zip(want) {
            assert!((*got as f64 - want).abs() < 1e-6, "{g:?} vs {want:?}");
        }
    }
}
