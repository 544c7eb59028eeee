use tch::Kind;

use super::*;

/// The operands of a small case: `b = 2` streams, `h = 2` heads, `m` queries over `n`
/// keys with `p` position rows. Counters as a compacted cache has them (each stream's
/// keys at distinct distances, the block's own last, at `0, -1, ..`); spans with
/// fractional parts 0.3-0.7, so that no pair sits on a kink of the mask (finite
/// differences); usable per stream or per query.
struct Case {
    positions: Tensor,
    spans: Tensor,
    counter: Tensor,
    usable: Tensor,
    ramp: f64,
    p: i64,
}

fn case(m: i64, n: i64, p: i64, per_query: bool, kind: Kind) -> Case {
    let mut rng = lethe_core::rng::Rng::new(11);
    let (b, h) = (2, 2);
    let cached = n - m;
    // Stream 0: every cached key one step apart; stream 1: gaps (some deleted).
    let mut counter = Vec::new();
    for s in 0..b {
        let mut row: Vec<f64> = (0..cached).map(|j| ((cached - j) * (1 + s)) as f64).collect();
        row.extend((0..m).map(|j| -(j as f64)));
        counter.extend(row);
    }
    let counter = Tensor::from_slice(&counter).view([b, n]).to_kind(kind);
    let whole = rng.uniform_tensor(&[b, n], Kind::Double) * 12.0;
    let spans = (whole.floor() + rng.uniform_tensor(&[b, n], Kind::Double) * 0.4 + 0.3).to_kind(kind);
    let usable = match per_query {
        false => rng.uniform_tensor(&[b, 1, n], Kind::Double).gt(0.2),
        true => rng.uniform_tensor(&[b, m, n], Kind::Double).gt(0.2),
    };
    let positions = rng.normal_tensor(&[b, h, m, p], Kind::Double).to_kind(kind);
    Case { positions, spans, counter, usable, ramp: 3.0, p }
}

/// What the bias, the ramp counts and each key's ramp distances are, pair by pair, as
/// plain arithmetic on numbers read out of the tensors (Eq. 4-5, A.1).
fn by_hand(c: &Case) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b, h, m, p) = (c.positions.size()[0], c.positions.size()[1], c.positions.size()[2], c.p);
    let n = c.spans.size()[1];
    let u = c.usable.size()[1];
    let (mut bias, mut counts, mut distances) = (vec![], vec![0.0; (b * n) as usize], vec![0.0; (b * n) as usize]);
    for s in 0..b {
        for head in 0..h {
            for q in 0..m {
                for k in 0..n {
                    let dist = c.counter.double_value(&[s, k]) + q as f64;
                    let mask = ((c.spans.double_value(&[s, k]) - dist) / c.ramp + 1.0).clamp(0.0, 1.0);
                    let usable = c.usable.int64_value(&[s, if u == 1 { 0 } else { q }, k]) == 1;
                    if !(usable && dist >= 0.0 && mask > 0.0) {
                        bias.push(f64::NEG_INFINITY);
                        continue;
                    }
                    let position =
                        if dist < p as f64 { c.positions.double_value(&[s, head, q, dist as i64]) } else { 0.0 };
                    bias.push(mask.ln() + position);
                    if head == 0 && mask < 1.0 {
                        counts[(s * n + k) as usize] += 1.0;
                        distances[(s * n + k) as usize] += dist;
                    }
                }
            }
        }
    }
    (bias, counts, distances)
}

fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).expect("a tensor of numbers")
}

/// Each entry of the bias is the mask's log plus the position term where the key is
/// seen, `-inf` where it is not (not usable, later than the query, expired), the ramp
/// counts and distances count the pairs seen with `0 < m < 1`, and the span loss is
/// `scale * mean over streams of sum over the ramp pairs of r = e - dist` (4.2): keys per
/// stream and per query, some beyond the position rows.
#[test]
fn the_bias_and_the_span_loss_are_what_the_paper_defines() {
    for per_query in [false, true] {
        let c = case(5, 12, 4, per_query, Kind::Double);
        let scale = 0.37;
        let out = expire_bias(&c.positions, &c.spans, &c.counter, &c.usable, c.ramp, Some(scale)).unwrap();
        let (bias, counts, distances) = by_hand(&c);
        let got = values(&out.bias);
        assert_eq!(got.len(), bias.len());
        let seen = bias.iter().filter(|v| v.is_finite()).count();
        assert!(seen > 20 && seen < bias.len() - 20, "the case has pairs seen and not seen: {seen} of {}", bias.len());
        for (i, (a, b)) in got.iter().zip(&bias).enumerate() {
            assert!(a == b || (a - b).abs() < 1e-12, "entry {i}: {a} against {b} by hand");
        }
        let (c_got, d_got) = out.ramp.expect("asked for");
        assert!(counts.iter().any(|&x| x > 0.0), "some keys are on the ramp");
        assert_eq!(values(&c_got), counts);
        assert_eq!(values(&d_got), distances);
        let spans = values(&c.spans);
        let by_ramp: f64 = spans.iter().zip(&counts).zip(&distances).map(|((e, c), d)| e * c - d).sum();
        let loss = out.loss.expect("asked for").double_value(&[]);
        let expected = scale * by_ramp / 2.0;
        assert!(
            expected != 0.0 && (loss - expected).abs() < 1e-12 * expected.abs(),
            "loss {loss} against {expected} by hand"
        );
    }
    // A scale of 0: the parts without the loss.
    let c = case(5, 12, 4, false, Kind::Double);
    let out = expire_bias(&c.positions, &c.spans, &c.counter, &c.usable, c.ramp, Some(0.0)).unwrap();
    assert!(out.ramp.is_some() && out.loss.is_none());
}

/// Without a loss no ramp parts come back; in float the bias is the double one's,
/// rounded.
#[test]
fn float_follows_double_and_stats_are_optional() {
    let d = case(6, 15, 5, false, Kind::Double);
    let f = case(6, 15, 5, false, Kind::Float);
    let bd = expire_bias(&d.positions, &d.spans, &d.counter, &d.usable, d.ramp, None).unwrap();
    let bf = expire_bias(&f.positions, &f.spans, &f.counter, &f.usable, f.ramp, None).unwrap();
    assert!(bd.ramp.is_none() && bf.ramp.is_none() && bd.loss.is_none());
    assert_eq!(bf.bias.kind(), Kind::Float);
    let (a, b) = (values(&bd.bias), values(&bf.bias));
    for (x, y) in a.iter().zip(&b) {
        assert!(x == y || (x - y).abs() < 1e-5 * (1.0 + x.abs()), "{x} against {y}");
    }
}

/// The backward pass against central finite differences, in double: the gradient of
/// `sum(w * bias)` over the seen pairs, plus the span loss, to every position score and
/// every span.
#[test]
fn the_gradients_match_finite_differences() {
    for per_query in [false, true] {
        let c = case(4, 10, 3, per_query, Kind::Double);
        let positions = c.positions.set_requires_grad(true);
        let spans = c.spans.set_requires_grad(true);
        let first = expire_bias(&positions, &spans, &c.counter, &c.usable, c.ramp, None).unwrap().bias;
        let seen = first.isfinite().detach();
        let weights =
            lethe_core::rng::Rng::new(3).normal_tensor(&first.size(), Kind::Double) * seen.to_kind(Kind::Double);
        let objective = |pq: &Tensor, e: &Tensor| {
            let out = expire_bias(pq, e, &c.counter, &c.usable, c.ramp, Some(0.8)).unwrap();
            (out.bias.where_scalarother(&seen, 0.0) * &weights).sum(Kind::Double) + out.loss.expect("asked for")
        };
        let grads = Tensor::run_backward(&[objective(&positions, &spans)], &[&positions, &spans], false, false);
        let eps = 1e-6;
        for (which, (param, grad)) in [(&positions, &grads[0]), (&spans, &grads[1])].into_iter().enumerate() {
            let flat = param.detach().flatten(0, -1);
            let analytic = values(grad);
            assert!(analytic.iter().any(|g| g.abs() > 1e-3), "input {which}: some gradient flows");
            for i in 0..flat.size()[0] {
                let shifted = |delta: f64| {
                    let moved = flat.copy();
                    let _ = moved.get(i).f_add_scalar_(delta).unwrap();
                    let moved = moved.view(param.size().as_slice());
                    let _guard = tch::no_grad_guard();
                    match which {
                        0 => objective(&moved, &spans.detach()),
                        _ => objective(&positions.detach(), &moved),
                    }
                    .double_value(&[])
                };
                let numeric = (shifted(eps) - shifted(-eps)) / (2.0 * eps);
                let a = analytic[i as usize];
                assert!(
                    (a - numeric).abs() < 1e-6 * (1.0 + a.abs()),
                    "input {which}, entry {i}: {a} against {numeric}"
                );
            }
        }
    }
}

/// Bad operands are refused with a message, not a crash.
#[test]
fn mismatched_operands_are_refused() {
    let c = case(4, 10, 3, false, Kind::Double);
    let error = expire_bias(&c.positions, &c.spans.to_kind(Kind::Float), &c.counter, &c.usable, c.ramp, None)
        .err()
        .expect("kinds differ");
    assert!(error.to_string().contains("one float kind"), "{error}");
    let error = expire_bias(&c.positions, &c.spans.narrow(1, 0, 9), &c.counter, &c.usable, c.ramp, None)
        .err()
        .expect("shapes differ");
    assert!(error.to_string().contains("expire-span bias"), "{error}");
}

/// Without a GPU the CPU's loops are the only place it runs; no library is needed.
#[test]
fn the_cpu_needs_no_library() {
    assert!(runs_on(Device::Cpu).unwrap());
    assert!(!runs_on(Device::Mps).unwrap());
}

/// What is not this lethe's kernel library is refused with the reason, and nothing is
/// loaded: a library of another ABI (compiled here by the C++ compiler that builds lethe's
/// own), and a file that is
/// no library at all.
#[test]
fn a_library_that_is_not_these_kernels_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("other.cpp");
    std::fs::write(&source, "extern \"C\" int lethe_cuda_abi(void) { return 99; }\n").unwrap();
    let other = dir.path().join("libother.so");
    let built = std::process::Command::new("c++")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&other)
        .arg(&source)
        .status()
        .expect("the C++ compiler that builds lethe's C++");
    assert!(built.success());
    let error = load(&other).expect_err("another ABI").to_string();
    assert!(error.contains("ABI 99, expected 2") && error.contains("scripts/build-cuda.sh"), "{error}");
    let text = dir.path().join("liblethe_cuda.so");
    std::fs::write(&text, "not a library").unwrap();
    let error = load(&text).expect_err("no library").to_string();
    assert!(error.contains("cannot load") && error.contains("liblethe_cuda.so"), "{error}");
    // SAFETY: reads a flag.
    assert_eq!(unsafe { lethe_cuda_kernels_ready() }, 0, "nothing was loaded");
}
