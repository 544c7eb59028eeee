//! `memory.expire.target`: Expire-Span's span-loss weight steered toward a memory.
//!
//! The paper sets the memory through the span loss's weight `alpha` (Eq. 7): a larger
//! weight shortens the spans. Which weight gives which memory depends on the model and
//! the data, so comparing a fitted Expire-Span with the key-value cache policies at a
//! given memory took a search over `alpha`. Here the weight follows the memory `m` the
//! last step's queries saw (a layer's mean, averaged over the layers, micro-batches and
//! ranks) with a proportional-integral controller on its logarithm:
//!
//! `weight = alpha f (m / target)`, then `f <- f (m / target)^rate`,
//!
//! each factor kept within 1e-3 and 1e3. Above the target the weight grows and the spans
//! shrink, below it the weight falls; the integral `f` finds the weight at which the
//! memory stays at the target, the proportional part damps the overshoot of spans that
//! answer a few steps late. The spans shrink under the loss faster than the task's
//! gradient grows them, so a run should start from an `alpha` below the one the target
//! needs. The controller's state travels in checkpoints, so a resumed run goes on where
//! it stopped.

use lethe_core::config::{Config, Mechanism};

/// The bounds of the controller's factors.
const FACTOR_RANGE: (f64, f64) = (1e-3, 1e3);

/// The controller of a run with a target.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanTarget {
    target: f64,
    rate: f64,
    /// The integral factor `f`.
    integral: f64,
    /// The last step's `m / target`.
    ratio: f64,
}

impl SpanTarget {
    /// The controller of `cfg` (None without Expire-Span or a target), from a
    /// checkpoint's [`SpanTarget::state`] or anew.
    pub fn of(cfg: &Config, saved: Option<[f64; 2]>) -> Option<SpanTarget> {
        let expire = &cfg.memory.expire;
        let [integral, ratio] = saved.unwrap_or([1.0, 1.0]);
        (cfg.memory.mechanism == Mechanism::Expire && expire.target > 0.0).then(|| SpanTarget {
            target: expire.target,
            rate: expire.target_rate,
            integral: bounded(integral),
            ratio: bounded(ratio),
        })
    }

    /// The factor on the span loss's weight for the next step.
    pub fn factor(&self) -> f64 {
        bounded(self.integral * self.ratio)
    }

    /// After a step whose queries saw `memory` memories a layer (a figure that is not
    /// finite changes nothing).
    pub fn observe(&mut self, memory: f64) {
        if !memory.is_finite() {
            return;
        }
        self.ratio = bounded(memory / self.target);
        self.integral = bounded(self.integral * self.ratio.powf(self.rate));
    }

    /// What a checkpoint keeps: the integral factor and the last ratio.
    pub fn state(&self) -> [f64; 2] {
        [self.integral, self.ratio]
    }
}

fn bounded(factor: f64) -> f64 {
    factor.clamp(FACTOR_RANGE.0, FACTOR_RANGE.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expire_with_target(target: f64) -> Config {
        let mut cfg = Config::default();
        cfg.memory.mechanism = Mechanism::Expire;
        (cfg.memory.expire.target, cfg.memory.expire.target_rate) = (target, 0.1);
        cfg
    }

    #[test]
    fn the_weight_follows_the_memory_and_its_integral_settles_at_the_target() {
        let mut t = SpanTarget::of(&expire_with_target(40.0), None).unwrap();
        assert_eq!(t.factor(), 1.0);
        t.observe(80.0); // twice the target: twice the weight, the integral up by 2^0.1
        assert!((t.factor() - 2.0 * 2f64.powf(0.1)).abs() < 1e-12, "{}", t.factor());
        t.observe(20.0); // half: half the weight, the integral back where it started
        assert!((t.factor() - 0.5).abs() < 1e-12, "{}", t.factor());
        t.observe(40.0);
        assert!((t.factor() - 1.0).abs() < 1e-12, "{}", t.factor());
        let before = t.clone();
        t.observe(f64::NAN);
        assert_eq!(t, before);
        let resumed = SpanTarget::of(&expire_with_target(40.0), Some(t.state())).unwrap();
        assert_eq!(resumed, t);
    }

    #[test]
    fn the_factors_are_bounded_and_only_expire_span_with_a_target_has_them() {
        let mut t = SpanTarget::of(&expire_with_target(1.0), None).unwrap();
        (0..1000).for_each(|_| t.observe(1e9));
        assert_eq!((t.state(), t.factor()), ([1e3, 1e3], 1e3));
        (0..1000).for_each(|_| t.observe(0.0));
        assert_eq!((t.state(), t.factor()), ([1e-3, 1e-3], 1e-3));
        assert!(SpanTarget::of(&expire_with_target(0.0), None).is_none());
        let mut adaptive = expire_with_target(40.0);
        adaptive.memory.mechanism = Mechanism::Adaptive;
        assert!(SpanTarget::of(&adaptive, None).is_none());
    }
}
