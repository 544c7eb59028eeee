//! The dynamic loss scale of float16 training (`train.precision = "f16"`), as PyTorch's
//! `torch.amp.GradScaler` keeps it: float16's smallest normal number is 6e-5, so the loss
//! is multiplied by a scale `S` before the backward pass and the gradients divided by it
//! after, which keeps small gradients from flushing to zero. A step whose gradients hold
//! an infinity or a NaN is skipped and `S` halved; after [`GROWTH_INTERVAL`] steps in a
//! row without one, `S` doubles. `S` starts at [`INITIAL`].

/// The scale a float16 run starts with (GradScaler's `init_scale`).
pub const INITIAL: f64 = 65536.0;

/// Steps without an overflow after which the scale doubles (GradScaler's `growth_interval`).
pub const GROWTH_INTERVAL: usize = 2000;

/// The scale's least value: a run whose gradients overflow even there has diverged, and
/// scaling further down would only hide it.
pub const SMALLEST: f64 = 1.0 / 65536.0;

/// The loss scale and the steps since it last changed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScale {
    /// The factor on the loss before the backward pass.
    pub scale: f64,
    /// Steps in a row whose gradients were finite.
    pub good_steps: usize,
}

impl Default for LossScale {
    fn default() -> Self {
        LossScale { scale: INITIAL, good_steps: 0 }
    }
}

impl LossScale {
    /// After a step whose gradients were `finite` or not: whether the step overflowed
    /// (then it is to be skipped, and the scale was halved). At the least scale an
    /// overflow is not one: the caller's check of the gradients stops the run.
    pub fn overflowed(&mut self, finite: bool) -> bool {
        if !finite {
            let shrinkable = self.scale > SMALLEST;
            self.scale = (self.scale / 2.0).max(SMALLEST);
            self.good_steps = 0;
            return shrinkable;
        }
        self.good_steps += 1;
        if self.good_steps == GROWTH_INTERVAL {
            self.scale *= 2.0;
            self.good_steps = 0;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overflow_halves_the_scale_and_a_run_of_good_steps_doubles_it() {
        let mut s = LossScale::default();
        assert!(s.overflowed(false));
        assert_eq!(s, LossScale { scale: 32768.0, good_steps: 0 });
        for _ in 0..GROWTH_INTERVAL - 1 {
            assert!(!s.overflowed(true));
        }
        assert_eq!(s, LossScale { scale: 32768.0, good_steps: GROWTH_INTERVAL - 1 });
        assert!(!s.overflowed(true));
        assert_eq!(s, LossScale { scale: 65536.0, good_steps: 0 });
        // An overflow resets the count of good steps.
        s.overflowed(true);
        s.overflowed(false);
        assert_eq!(s, LossScale { scale: 32768.0, good_steps: 0 });
        // Down to the least scale, where an overflow is a divergence.
        for _ in 0..31 {
            assert!(s.overflowed(false));
        }
        assert_eq!(s.scale, SMALLEST);
        assert!(!s.overflowed(false));
    }
}
