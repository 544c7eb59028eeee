//! Parameters made only to be overwritten. A model built to receive a checkpoint's
//! parameters ([`crate::Lm::from_checkpoint`]) or a pretrained model's
//! ([`crate::init::build`]) would throw away the initial values it drew for them: about
//! a second and a half for 135M parameters on two cores, longer than reading them, and
//! ten times that for a 1B decoder. Within [`given`], every initialiser of the model's
//! parameters that draws ([`drawn`], [`var`], [`drawn_linear`]) makes zeros instead for
//! the parameters it names, and draws the others (a memory the source lacks) from
//! torch's stream as usual; with [`Given::All`] nothing is drawn and the stream is left
//! where it was.

use std::cell::RefCell;
use std::collections::HashSet;

use tch::{nn, Tensor};

/// The parameters whose values will be given, by their full names.
pub(crate) enum Given {
    /// Every parameter.
    All,
    /// Those named.
    These(HashSet<String>),
}

thread_local! {
    /// The parameters made on this thread now whose values will be given.
    static GIVEN: RefCell<Option<Given>> = const { RefCell::new(None) };
}

/// `f`'s result, the parameters it makes on this thread that `given` names left
/// undrawn (zeros).
pub(crate) fn given<T>(given: Given, f: impl FnOnce() -> T) -> T {
    /// Puts the set back as it was, however `f` ends.
    struct Restore(Option<Given>);
    impl Drop for Restore {
        fn drop(&mut self) {
            GIVEN.with(|g| *g.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(GIVEN.with(|g| g.borrow_mut().replace(given)));
    f()
}

/// Whether the parameter named `name` under `p` will be given.
fn is_given(p: &nn::Path, name: &str) -> bool {
    GIVEN.with(|g| match &*g.borrow() {
        None => false,
        Some(Given::All) => true,
        Some(Given::These(names)) => names.contains(&p.path(name)),
    })
}

/// `init` for the parameter `name` under `p`, or zeros where it will be given.
pub(crate) fn drawn(p: &nn::Path, name: &str, init: nn::Init) -> nn::Init {
    if is_given(p, name) {
        nn::Init::Const(0.0)
    } else {
        init
    }
}

/// The parameter `name` under `p`, of shape `dims`, from `init` ([`drawn`]).
pub(crate) fn var(p: &nn::Path, name: &str, dims: &[i64], init: nn::Init) -> Tensor {
    p.var(name, dims, drawn(p, name, init))
}

/// A projection's `config` under `p`, with zeros for its weight and its bias where they
/// will be given (tch draws a bias it is given no initialiser for).
pub(crate) fn drawn_linear(p: &nn::Path, config: nn::LinearConfig) -> nn::LinearConfig {
    let weight = drawn(p, "weight", config.ws_init);
    let bias = if is_given(p, "bias") { Some(nn::Init::Const(0.0)) } else { config.bs_init };
    nn::LinearConfig { ws_init: weight, bs_init: bias, ..config }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the parameters named are left zero; the set is put back after the call.
    #[test]
    fn only_the_given_parameters_are_left_undrawn() {
        let _section = lethe_core::rng::seed_torch(0); // the draws below, in a section of their own
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let p = vs.root() / "layer";
        let names = HashSet::from(["layer.a".to_string(), "layer.lin.bias".to_string()]);
        let uniform = nn::Init::Uniform { lo: 1.0, up: 2.0 };
        let (a, b, lin) = given(Given::These(names), || {
            let lin = nn::linear(&p / "lin", 3, 2, drawn_linear(&(&p / "lin"), Default::default()));
            (var(&p, "a", &[4], uniform), var(&p, "b", &[4], uniform), lin)
        });
        assert_eq!(a.abs().sum(tch::Kind::Float).double_value(&[]), 0.0);
        assert!(b.min().double_value(&[]) >= 1.0);
        assert!(lin.ws.abs().sum(tch::Kind::Float).double_value(&[]) > 0.0);
        assert_eq!(lin.bs.unwrap().abs().sum(tch::Kind::Float).double_value(&[]), 0.0);
        assert!(var(&p, "c", &[4], uniform).min().double_value(&[]) >= 1.0, "the set outlived the call");
    }
}
