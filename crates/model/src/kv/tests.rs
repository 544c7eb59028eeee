use tch::{Kind, Tensor};

use super::*;

fn err(r: Result<impl std::fmt::Debug>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn budgets_read_entries_and_fractions() {
    assert_eq!(Budget::parse("1024").unwrap(), Budget::Entries(1024));
    assert_eq!(Budget::parse("0.25").unwrap(), Budget::Fraction(0.25));
    assert_eq!(Budget::parse("1/4").unwrap(), Budget::Fraction(0.25));
    assert_eq!(Budget::Fraction(0.25).entries(100).unwrap(), 25);
    assert_eq!(Budget::Fraction(1.0 / 16.0).entries(10).unwrap(), 1, "a fraction keeps at least one entry");
    assert_eq!(Budget::Entries(100).entries(100).unwrap(), 100);
    for bad in ["0", "-3", "1.5", "0.0", "abc", "1/0", "x/2", ""] {
        let e = err(Budget::parse(bad));
        assert!(e.starts_with(&format!("--budget {bad}:")), "{bad}: {e}");
    }
    let e = err(Budget::Entries(5000).entries(1000));
    assert!(e.contains("5000 is more than the 1000 tokens of context"), "{e}");
}

#[test]
fn policies_are_read_by_name_with_their_settings() {
    let p = Policy::parse("snapkv:window=8,kernel=3", Some(Budget::Entries(32)), 100).unwrap();
    assert_eq!((p.name, p.budget), ("snapkv", Some(32)));
    assert_eq!((p.options.get("window", 64.0), p.options.get("kernel", 5.0)), (8.0, 3.0));
    assert_eq!(Policy::parse("full", None, 100).unwrap().budget, None);
    assert_eq!(Policy::parse("h2o", Some(Budget::Fraction(0.5)), 100).unwrap().budget, Some(50));
    let cases = [
        (
            "lru",
            Some(Budget::Entries(8)),
            "--policy lru: unknown; known policies: full, window, streaming, h2o, tova, snapkv",
        ),
        ("full", Some(Budget::Entries(8)), "--budget: --policy full keeps every entry"),
        ("h2o", None, "--policy h2o needs --budget"),
        (
            "snapkv",
            Some(Budget::Entries(32)),
            "window = 64: a whole number of queries, 1 or more and below the budget of 32",
        ),
        ("snapkv:window=8,kernel=4", Some(Budget::Entries(32)), "kernel = 4: an odd whole number"),
        ("streaming", Some(Budget::Entries(4)), "its 4 sinks leave no room for a window in a budget of 4"),
        ("streaming:sinks=1.5", Some(Budget::Entries(8)), "sinks = 1.5"),
        ("h2o:recent=2", Some(Budget::Entries(8)), "recent = 2: a share in [0, 1]"),
        ("h2o:bogus=1", Some(Budget::Entries(8)), "`bogus` is not a setting of h2o; its settings: recent"),
        ("h2o:recent", Some(Budget::Entries(8)), "`recent` is not key=value"),
        ("h2o:recent=half", Some(Budget::Entries(8)), "recent = `half` is not a number"),
        ("tova", Some(Budget::Entries(500)), "--budget 500 is more than the 100 tokens of context"),
    ];
    for (spec, budget, want) in cases {
        let e = err(Policy::parse(spec, budget, 100));
        assert!(e.contains(want), "{spec}: {e}");
        assert!(!e.contains('\n'), "{spec}: one line: {e}");
    }
}

/// `n` entries of one key-value head at the positions `positions`, keys and values their
/// position as a number.
fn held(positions: &[i64]) -> Held {
    let p = Tensor::from_slice(positions).view([1, 1, -1]);
    let x = p.to_kind(Kind::Float).unsqueeze(-1);
    Held::new(x.shallow_clone(), x, p)
}

/// Attention weights `(1, 2, 1, n)`: two query heads sharing the one key-value head.
fn weights(head0: &[f32], head1: &[f32]) -> Tensor {
    Tensor::stack(&[Tensor::from_slice(head0), Tensor::from_slice(head1)], 0).view([1, 2, 1, -1])
}

fn positions(h: &Held) -> Vec<i64> {
    Vec::<i64>::try_from(h.positions.flatten(0, -1)).unwrap()
}

fn chunk_update(policy: &mut dyn LayerPolicy, h: &mut Held, w: &Tensor, at: i64) {
    let q = Tensor::zeros([1, 2, 1, 1], (Kind::Float, tch::Device::Cpu));
    let pos = Tensor::from_slice(&[at]);
    policy.update(h, &Chunk { queries: &q, query_positions: &pos, weights: Some(w), scale: 1.0 });
}

/// H2O by hand, budget 3 with one recent entry: the attention each entry received is
/// summed over the two query heads and over the steps; the two highest of the older
/// entries stay with the newest.
#[test]
fn h2o_keeps_the_heavy_hitters_by_accumulated_attention() {
    let p = Policy::parse("h2o:recent=0.34", Some(Budget::Entries(3)), 10).unwrap();
    let mut layer = p.layer();
    let mut h = held(&[0, 1, 2, 3]);
    // Received: [0.4, 0.8, 0.5, 0.3]; the older three's best two are 1 and 2.
    chunk_update(layer.as_mut(), &mut h, &weights(&[0.1, 0.5, 0.2, 0.2], &[0.3, 0.3, 0.3, 0.1]), 3);
    assert_eq!(positions(&h), [1, 2, 3]);
    assert_eq!(Vec::<f32>::try_from(h.values.flatten(0, -1)).unwrap(), [1.0, 2.0, 3.0], "values follow their keys");
    // Entry 4 comes in. Received now [0.1, 0.3, 1.2, 0.4]: accumulated 0.9 (1), 0.8 (2),
    // 1.5 (3); 2 had more than 1 at the last step alone, not in all.
    let new = held(&[4]);
    h.append(&new.keys, &new.values, &new.positions);
    chunk_update(layer.as_mut(), &mut h, &weights(&[0.1, 0.1, 0.6, 0.2], &[0.0, 0.2, 0.6, 0.2]), 4);
    assert_eq!(positions(&h), [1, 3, 4]);
}

/// TOVA by hand: the newest query's weights averaged over the heads; the newest entry
/// stays whatever its weight.
#[test]
fn tova_drops_what_the_newest_query_attends_to_least() {
    let p = Policy::parse("tova", Some(Budget::Entries(2)), 10).unwrap();
    let mut layer = p.layer();
    let mut h = held(&[0, 1, 2]);
    // Mean over heads: [0.45, 0.3, 0.25]: entry 2 is the newest, kept; then entry 0.
    chunk_update(layer.as_mut(), &mut h, &weights(&[0.8, 0.1, 0.1], &[0.1, 0.5, 0.4]), 2);
    assert_eq!(positions(&h), [0, 2]);
}

/// StreamingLLM keeps the sinks and the window; the window policy the window alone.
#[test]
fn streaming_keeps_sinks_and_a_window_and_window_the_window() {
    let w = Tensor::full([1, 2, 1, 10], 0.1, (Kind::Float, tch::Device::Cpu));
    let streaming = Policy::parse("streaming:sinks=2", Some(Budget::Entries(5)), 10).unwrap();
    let mut h = held(&(0..10).collect::<Vec<_>>());
    chunk_update(streaming.layer().as_mut(), &mut h, &w, 9);
    assert_eq!(positions(&h), [0, 1, 7, 8, 9]);
    assert_eq!(streaming.layer().positions(), Positions::InCache);
    let window = Policy::parse("window", Some(Budget::Entries(3)), 10).unwrap();
    let mut h = held(&(0..10).collect::<Vec<_>>());
    chunk_update(window.layer().as_mut(), &mut h, &w, 9);
    assert_eq!(positions(&h), [7, 8, 9]);
    assert_eq!(window.layer().positions(), Positions::Absolute);
}
