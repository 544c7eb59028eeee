//! Parameters made only to be overwritten. [`crate::Lm::from_checkpoint`] builds a model
//! to copy a checkpoint's parameters into it; drawing their initial values first would be
//! thrown away (about a second and a half for 135M parameters on two cores, longer than
//! reading them). Within [`undrawn`], every initialiser of the model's parameters that
//! draws ([`drawn`], [`drawn_linear`]) makes zeros instead, and torch's random stream is
//! left where it was.

use std::cell::Cell;

use tch::nn;

thread_local! {
    /// Whether parameters made on this thread now are left undrawn.
    static UNDRAWN: Cell<bool> = const { Cell::new(false) };
}

/// `f`'s result, every parameter it makes on this thread left undrawn (zeros).
pub(crate) fn undrawn<T>(f: impl FnOnce() -> T) -> T {
    /// Puts the flag back as it was, however `f` ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            UNDRAWN.with(|u| u.set(self.0));
        }
    }
    let _restore = Restore(UNDRAWN.with(|u| u.replace(true)));
    f()
}

/// `init`, or zeros within [`undrawn`].
pub(crate) fn drawn(init: nn::Init) -> nn::Init {
    if UNDRAWN.with(Cell::get) {
        nn::Init::Const(0.0)
    } else {
        init
    }
}

/// A projection's `config`, or zeros for its weight and bias within [`undrawn`] (tch
/// draws a bias it is given no initialiser for).
pub(crate) fn drawn_linear(config: nn::LinearConfig) -> nn::LinearConfig {
    if UNDRAWN.with(Cell::get) {
        nn::LinearConfig { ws_init: nn::Init::Const(0.0), bs_init: Some(nn::Init::Const(0.0)), ..config }
    } else {
        config
    }
}
