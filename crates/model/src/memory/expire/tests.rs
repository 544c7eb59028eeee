use super::*;

fn vec1(t: &Tensor) -> Vec<f64> {
    t.to_kind(Kind::Double).flatten(0, -1).try_into().unwrap()
}

/// `update` handed what `attend` of the same block built reuses it; the memory must
/// be what `update` alone builds, and a block updated without it builds its own.
#[test]
fn update_after_attend_keeps_what_update_alone_keeps() {
    use crate::attention::Attention;
    let _seed = lethe_core::rng::seed_torch(3);
    let mut rng = lethe_core::rng::Rng::new(3);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let attn = Attention::new(vs.root() / "attn", 8, 2, 0.0, false);
    let cfg = ExpireConfig { ramp: 2, init_fraction: 0.5, ..ExpireConfig::default() };
    let mut attended = ExpireSpan::new(vs.root() / "attn", 8, 1, 12, 5, &cfg);
    let mut plain = attended.fresh();
    let key_pe = Tensor::zeros([5, 4], (Kind::Float, tch::Device::Cpu));
    let states = |m: &dyn MemoryLayer| m.state().into_iter().map(|(_, t)| t).collect::<Vec<_>>();
    for _ in 0..6 {
        let x = rng.normal_tensor(&[2, 4, 8], Kind::Float);
        let q = attn.queries(&x);
        let out = attended
            .attend(&AttendInput {
                x: &x,
                q: &q,
                attn: &attn,
                key_pe: Some(&key_pe),
                train: false,
                episodes: None,
                norm: None,
            })
            .unwrap();
        attended.update(&x.detach(), None, out.carry).unwrap();
        plain.update(&x, None, Carry::none()).unwrap();
        let (a, b) = (states(&attended), states(plain.as_ref()));
        assert!(!a.is_empty() && a.len() == b.len() && a.iter().zip(&b).all(|(a, b)| a.equal(b)));
    }
    let (keyed, other) = (rng.normal_tensor(&[2, 4, 8], Kind::Float), rng.normal_tensor(&[2, 4, 8], Kind::Float));
    let q = attn.queries(&keyed);
    attended
        .attend(&AttendInput {
            x: &keyed,
            q: &q,
            attn: &attn,
            key_pe: Some(&key_pe),
            train: false,
            episodes: None,
            norm: None,
        })
        .unwrap();
    attended.update(&other, None, Carry::none()).unwrap();
    plain.update(&other, None, Carry::none()).unwrap();
    let (a, b) = (states(&attended), states(plain.as_ref()));
    assert!(a.iter().zip(&b).all(|(a, b)| a.equal(b)));
}

/// On the CPU the compaction leaves room for the next block, which is written there
/// once instead of joined in a copy: the states are `[cache, block]` either way, and a
/// second block over the same cache (no update between) joins them anew.
#[test]
fn the_next_block_goes_into_the_room_left_by_the_compaction_once() {
    let mut rng = lethe_core::rng::Rng::new(4);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let cfg = ExpireConfig { ramp: 2, init_fraction: 0.5, ..ExpireConfig::default() };
    let mut mem = ExpireSpan::new(vs.root() / "attn", 8, 1, 12, 5, &cfg);
    mem.update(&rng.normal_tensor(&[2, 4, 8], Kind::Float), None, Carry::none()).unwrap();
    mem.update(&rng.normal_tensor(&[2, 4, 8], Kind::Float), None, Carry::none()).unwrap();
    let cache = mem.state.as_ref().map(|c| c.states.copy()).unwrap();
    let room = mem.state.as_ref().and_then(|c| c.room.as_ref().map(Tensor::data_ptr));
    assert!(room.is_some(), "stream deletion on the CPU leaves room");
    let (x, y) = (rng.normal_tensor(&[2, 4, 8], Kind::Float), rng.normal_tensor(&[2, 4, 8], Kind::Float));
    let (into_room, _, _) = mem.keys_with_meta(&x);
    assert_eq!(Some(into_room.data_ptr()), room, "written into the room");
    assert!(into_room.equal(&Tensor::cat(&[&cache, &x], 1)));
    let (joined, _, _) = mem.keys_with_meta(&y);
    assert_ne!(Some(joined.data_ptr()), room, "the room is used once");
    assert!(joined.equal(&Tensor::cat(&[&cache, &y], 1)) && into_room.equal(&Tensor::cat(&[&cache, &x], 1)));
    // A block of another length joins the two.
    mem.update(&y, None, Carry::none()).unwrap();
    let z = rng.normal_tensor(&[2, 3, 8], Kind::Float);
    let cache = mem.state.as_ref().map(|c| c.states.copy()).unwrap();
    assert!(mem.keys_with_meta(&z).0.equal(&Tensor::cat(&[&cache, &z], 1)));
}

/// `as_official`: the first block attends over `m` zero states (normalised by the
/// layer's norm: its bias, here all 0.5) and never over itself. With every key of the
/// first query a zero state, its context is the value of the norm's bias, whatever
/// the spans; a change to one token's state leaves that token's own context as it
/// was, and (the check that the test can fail) changes it in lethe's own reading.
#[test]
fn the_official_reading_starts_from_zero_states_and_hides_a_token_from_itself() {
    use crate::attention::Attention;
    let _seed = lethe_core::rng::seed_torch(5);
    let mut rng = lethe_core::rng::Rng::new(5);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let attn = Attention::new(vs.root() / "attn", 8, 2, 0.0, false);
    let norm = tch::nn::layer_norm(vs.root() / "norm", vec![8], Default::default());
    let _ = tch::no_grad(|| norm.bs.as_ref().unwrap().shallow_clone().fill_(0.5));
    let key_pe = rng.normal_tensor(&[5, 4], Kind::Float);
    let x = rng.normal_tensor(&[2, 4, 8], Kind::Float);
    let changed = x.copy();
    let _ = changed.narrow(1, 2, 1).g_add_scalar_(1.0); // token 2's state

    // The same queries for every call: only the keys and values see the change.
    let q = attn.queries(&rng.normal_tensor(&[2, 4, 8], Kind::Float));
    let context = |official: bool, x: &Tensor| {
        let cfg = ExpireConfig { ramp: 2, init_fraction: 0.5, as_official: official, ..ExpireConfig::default() };
        let mut layer = ExpireSpan::new(vs.root() / "attn", 8, 1, 12, 5, &cfg);
        let input = AttendInput {
            x,
            q: &q,
            attn: &attn,
            key_pe: Some(&key_pe),
            train: false,
            episodes: None,
            norm: official.then_some(&norm),
        };
        tch::no_grad(|| layer.attend(&input).unwrap().context) // (b, h, m, dh)
    };
    let official = context(true, &x);
    let state = Tensor::full([2, 1, 8], 0.5, (Kind::Float, tch::Device::Cpu));
    let bias_value = attn.keys_values_after_cache(&state, &state).unwrap().1; // (b, h, 1, dh)
    assert!(
        official.narrow(2, 0, 1).allclose(&bias_value, 1e-6, 1e-6, false),
        "the first query sees only the zero states"
    );
    let own = |c: &Tensor| c.narrow(2, 2, 1);
    assert!(own(&context(true, &changed)).allclose(&own(&official), 1e-6, 1e-6, false), "token 2 saw itself");
    assert!(
        !own(&context(false, &changed)).allclose(&own(&context(false, &x)), 1e-4, 1e-4, false),
        "lethe's reading: token 2 sees itself"
    );
    assert!(
        !context(true, &changed).narrow(2, 3, 1).allclose(&official.narrow(2, 3, 1), 1e-4, 1e-4, false),
        "token 3 sees token 2"
    );
}

/// The attention as it was computed before the fused path: relative positions by a
/// gather, `-inf` where a key is not visible, softmax, then the soft mask with
/// renormalisation (Eq. 4), as the official code does.
fn reference_context(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_pe: &Tensor,
    dist: &Tensor,
    mask: &Tensor,
    visible: &Tensor,
) -> Tensor {
    let (b, h, m, _) = q.size4().unwrap();
    let (n, rows) = (dist.size()[2], key_pe.size()[0]);
    let q = q / (q.size()[3] as f64).sqrt();
    let index = dist.clamp(0.0, (rows - 1) as f64).to_kind(Kind::Int64).unsqueeze(1).expand([b, h, m, n], false);
    let in_range = dist.ge(0.0).logical_and(&dist.lt(rows as f64)).unsqueeze(1).to_kind(q.kind());
    let scores = q.matmul(&k.transpose(-2, -1)) + q.matmul(&key_pe.tr()).gather(-1, &index, false) * in_range;
    let probs = scores.masked_fill(&visible.logical_not().unsqueeze(1), f64::NEG_INFINITY).softmax(-1, q.kind());
    let probs = &probs * mask.unsqueeze(1);
    (&probs / (probs.sum_dim_intlist([-1i64].as_slice(), true, q.kind()) + 1e-8)).matmul(v)
}

/// The fused attention (one additive bias, `ln m` for the mask) computes what the
/// softmax, mask and renormalisation did, to the renormalisation's 1e-8, gradients
/// included (to the queries, keys, values, positions and the mask, through which the
/// spans learn); with every key near enough for a position, and with far keys.
#[test]
fn fused_attention_equals_the_masked_softmax_with_renormalisation() {
    let mut rng = lethe_core::rng::Rng::new(25);
    let cfg = ExpireConfig { ramp: 4, ..ExpireConfig::default() };
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    // Every cached memory near enough for a position; some too far back; a block
    // longer than the position rows; and an empty cache.
    for (cached, rows) in [(6, 8), (20, 8), (20, 4), (0, 8)] {
        let layer = ExpireSpan::new(vs.root() / "e", 8, 1, 32, rows, &cfg);
        let (b, h, m, dh, n) = (2, 3, 5, 4, cached + 5);
        let q = rng.normal_tensor(&[b, h, m, dh], Kind::Double).set_requires_grad(true);
        let k = rng.normal_tensor(&[b, h, n, dh], Kind::Double).set_requires_grad(true);
        let v = rng.normal_tensor(&[b, h, n, dh], Kind::Double).set_requires_grad(true);
        let key_pe = rng.normal_tensor(&[rows, dh], Kind::Double).set_requires_grad(true);
        let counter = compacted_counter(&mut rng, b, cached, m);
        let spans = rng.uniform_tensor(&[b, n], Kind::Double) * 2.0 * n as f64;
        let (r, dist) = remaining(&spans, &counter, m);
        let mask = soft_mask(&r, 4.0).detach().set_requires_grad(true);
        let valid = rng.uniform_tensor(&[b, 1, n], Kind::Double).gt(0.1);
        let visible = visible_pairs(&valid, &dist, &mask);
        assert!(mask.gt(0.0).logical_and(&mask.lt(1.0)).any().int64_value(&[]) == 1, "some memories are on the ramp");
        assert!(visible.logical_not().any().int64_value(&[]) == 1, "some are hidden");
        let fused = layer.context(&q, &k, &v, Some(&key_pe), &dist, &mask, &visible, 0.0, true);
        let reference = reference_context(&q, &k, &v, &key_pe, &dist, &mask, &visible);
        let gap = (&fused - &reference).abs().max().double_value(&[]);
        assert!(gap < 1e-7, "cached {cached}, rows {rows}: outputs differ by {gap}");
        // Without gradients (evaluation) too.
        let inference = tch::no_grad(|| layer.context(&q, &k, &v, Some(&key_pe), &dist, &mask, &visible, 0.0, false));
        let gap = (&inference - &reference).abs().max().double_value(&[]);
        assert!(gap < 1e-7, "cached {cached}, rows {rows}: without gradients, outputs differ by {gap}");
        let w = rng.normal_tensor(&fused.size(), Kind::Double);
        let inputs = [&q, &k, &v, &key_pe, &mask];
        let g1 = Tensor::run_backward(&[(&fused * &w).sum(Kind::Double)], &inputs, false, false);
        let g2 = Tensor::run_backward(&[(&reference * &w).sum(Kind::Double)], &inputs, false, false);
        for (i, (a, b)) in g1.iter().zip(&g2).enumerate() {
            assert!(a.isfinite().all().int64_value(&[]) == 1, "input {i}: a gradient is not finite");
            let gap = (a - b).abs().max().double_value(&[]);
            assert!(gap < 1e-6, "cached {cached}, rows {rows}, input {i}: gradients differ by {gap}");
        }
    }
}

/// A layer with the fused kernel computes what the written-out one does, block after
/// block (with deletion between), in training: the context, the span loss, the memory
/// report, what it keeps, and the gradients of the span predictor and the position
/// embeddings.
#[test]
fn the_fused_layer_equals_the_written_out_one() {
    layer_equals_written_out(4, 16, 5, Path::Fused, true);
}

/// The same over blocks of 150, whose queries the fused path takes in three chunks.
#[test]
fn the_fused_layer_in_chunks_equals_the_written_out_one() {
    assert_eq!(causal_chunks(20, 150, QUERY_CHUNK).len(), 3);
    layer_equals_written_out(150, 40, 41, Path::Fused, true);
}

/// The GPU's path, its kernels' arithmetic run on the CPU (one bias node, then the
/// attention over the whole block), computes what the written-out one does too.
#[test]
fn the_bias_layer_equals_the_written_out_one() {
    layer_equals_written_out(4, 16, 5, Path::Biased, true);
    layer_equals_written_out(70, 40, 41, Path::Biased, true);
}

/// Without episodes the GPU's path deletes by its kernels too (their loops on the CPU,
/// `compact::forget`), into a cache with the next block's room written: the same
/// contexts, gradients and caches as the written-out layer's libtorch compaction.
#[test]
fn the_bias_layer_deletes_by_its_kernels_as_the_written_out_one_does() {
    layer_equals_written_out(4, 16, 5, Path::Biased, false);
    layer_equals_written_out(70, 40, 41, Path::Biased, false);
}

/// Blocks of `m`, maximum span `max_span`, `positions` rows of `key_pe`; the second
/// layer takes `path`; with `with_episodes` the rows hold episodes.
fn layer_equals_written_out(m: i64, max_span: usize, positions: i64, path: Path, with_episodes: bool) {
    use crate::attention::Attention;
    let _seed = lethe_core::rng::seed_torch(5);
    let mut rng = lethe_core::rng::Rng::new(5);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let attn = Attention::new(vs.root() / "attn", 8, 2, 0.0, false);
    let cfg = ExpireConfig { ramp: 3, init_fraction: 0.4, alpha: 0.1, fused: false, ..ExpireConfig::default() };
    let mut written = ExpireSpan::new(vs.root() / "attn", 8, 1, max_span, positions, &cfg);
    let mut fused =
        ExpireSpan::new(vs.root() / "unused", 8, 1, max_span, positions, &ExpireConfig { fused: true, ..cfg.clone() });
    (fused.w, fused.b) = (written.w.shallow_clone(), written.b.shallow_clone());
    fused.bias_on_cpu = path == Path::Biased;
    let key_pe = (rng.normal_tensor(&[positions, 4], Kind::Float) * 0.5).set_requires_grad(true);
    // The span predictor's, the positions' and the attention's projections' (queries,
    // keys and values: the fused path reads them as head-split views; the output
    // projection is not used here).
    let mut named: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(name, _)| name.starts_with("attn") && !name.starts_with("attn.o."))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        named.iter().any(|(name, _)| name.ends_with("k.weight")),
        "{:?}",
        named.iter().map(|n| &n.0).collect::<Vec<_>>()
    );
    let params: Vec<Tensor> =
        named.into_iter().map(|(_, t)| t).chain([key_pe.shallow_clone()]).filter(|t| t.requires_grad()).collect();
    for step in 0..6 {
        let x = rng.normal_tensor(&[2, m, 8], Kind::Float);
        // Row 0 starts an episode in every block's middle; row 1 is one episode.
        let half = Tensor::arange(m, (Kind::Int64, tch::Device::Cpu)).ge(m / 2).to_kind(Kind::Int64);
        let episodes = Tensor::stack(&[half + step, Tensor::zeros([m], (Kind::Int64, tch::Device::Cpu))], 0); // (2, m)
        let q = attn.queries(&x);
        let input = AttendInput {
            x: &x,
            q: &q,
            attn: &attn,
            key_pe: Some(&key_pe),
            train: true,
            episodes: with_episodes.then_some(&episodes),
            norm: None,
        };
        assert_eq!((written.path(&input).unwrap(), fused.path(&input).unwrap()), (Path::WrittenOut, path));
        let (a, b) = (written.attend(&input).unwrap(), fused.attend(&input).unwrap());
        let gap = (&a.context - &b.context).abs().max().double_value(&[]);
        assert!(gap < 1e-5, "step {step}: contexts differ by {gap}");
        let (la, lb) = (a.aux_loss.as_ref().unwrap(), b.aux_loss.as_ref().unwrap());
        assert!(la.allclose(lb, 1e-5, 1e-9, false), "step {step}: span losses {la:?} and {lb:?}");
        let objective = |o: &AttendOutput| {
            (&o.context * o.context.ones_like().cumsum(-1, Kind::Float)).sum(Kind::Float) + o.aux_loss.as_ref().unwrap()
        };
        // The graph kept: the queries' projection is shared by the two.
        let ga = Tensor::run_backward(&[objective(&a)], &params, true, false);
        let gb = Tensor::run_backward(&[objective(&b)], &params, false, false);
        for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
            let gap = (x - y).abs().max().double_value(&[]);
            assert!(
                gap < 1e-4 * (1.0 + x.abs().max().double_value(&[])),
                "step {step}, parameter {i}: gradients differ by {gap}"
            );
        }
        assert_eq!(
            vec1(&Tensor::from_slice(&written.report().mem_rows)),
            vec1(&Tensor::from_slice(&fused.report().mem_rows)),
            "step {step}"
        );
        written.update(&x.detach(), with_episodes.then_some(&episodes), a.carry).unwrap();
        fused.update(&x.detach(), with_episodes.then_some(&episodes), b.carry).unwrap();
        let (sa, sb) = (written.state(), fused.state());
        assert_eq!(sa.len(), sb.len());
        assert!(sa.iter().zip(&sb).all(|((_, a), (_, b))| a.equal(b)), "step {step}: the caches differ");
        let by_kernels = fused.state.as_ref().is_some_and(|c| c.meta_room.is_some());
        assert_eq!(by_kernels, path == Path::Biased && !with_episodes, "step {step}: which deletion ran");
    }
}

#[test]
fn soft_mask_is_one_above_zero_zero_below_minus_r_and_linear_between() {
    let r = Tensor::from_slice(&[5.0f64, 0.0, -2.0, -4.0, -6.0, -3.0]);
    assert_eq!(vec1(&soft_mask(&r, 4.0)), vec![1.0, 1.0, 0.5, 0.0, 0.0, 0.25]);
}

#[test]
fn remaining_span_counts_the_distance_from_each_query() {
    // Two cached memories (counters 3 and 1), then a block of 2 (counters 0, -1).
    let spans = Tensor::from_slice(&[4.0f64, 2.0, 6.0, 1.0]).view([1, 4]);
    let counter = Tensor::from_slice(&[3.0f32, 1.0, 0.0, -1.0]).view([1, 4]);
    let (r, dist) = remaining(&spans, &counter, 2);
    assert_eq!(vec1(&dist), vec![3.0, 1.0, 0.0, -1.0, 4.0, 2.0, 1.0, 0.0]);
    assert_eq!(vec1(&r), vec![1.0, 1.0, 6.0, 2.0, 0.0, 0.0, 5.0, 1.0]);
}

/// Counters `(b, cached + m)` as after a per-stream compaction: `cached` memories at
/// increasing distances (gaps of 1-3), then the block's `m` at 0, -1, ..
fn compacted_counter(rng: &mut lethe_core::rng::Rng, b: i64, cached: i64, m: i64) -> Tensor {
    let gaps = (rng.uniform_tensor(&[b, cached], Kind::Double) * 3.0).floor() + 1.0;
    let cached_counter = gaps.flip([1]).cumsum(1, Kind::Double).flip([1]);
    let block_counter = -Tensor::arange(m, (Kind::Double, tch::Device::Cpu)).unsqueeze(0).expand([b, m], false);
    Tensor::cat(&[cached_counter, block_counter], 1)
}

/// What the span loss was before it was computed through the counts: the sum of the
/// remaining spans on the ramp over `(b, m, n)`, as the official code sums it.
fn reference_ramp_loss(spans: &Tensor, counter: &Tensor, usable: &Tensor, ramp: f64, block: i64, alpha: f64) -> Tensor {
    let (r, _) = remaining(spans, counter, block);
    let mask = soft_mask(&r, ramp);
    let ramp_pairs = usable.logical_and(&mask.gt(0.0)).logical_and(&mask.lt(1.0)).to_kind(r.kind());
    let per_stream = (&r * ramp_pairs).sum_dim_intlist([1i64, 2].as_slice(), false, r.kind()); // (b)
    per_stream.mean(r.kind()) * (alpha / ramp / block as f64)
}

/// The loss of a block from its spans and counters, as `attend` computes it.
fn loss_of(spans: &Tensor, counter: &Tensor, usable: &Tensor, ramp: f64, block: i64, alpha: f64) -> Tensor {
    let (r, dist) = remaining(spans, counter, block);
    let mask = soft_mask(&r, ramp);
    ramp_loss(spans, &dist, &on_ramp(&mask, &visible_pairs(usable, &dist, &mask)), ramp, block, alpha)
}

#[test]
fn ramp_loss_counts_only_memories_strictly_on_the_ramp() {
    // R = 4, block M = 2, one stream. Remaining spans r = e - (counter + q):
    // memory 0 (e 2, counter 4): -2, -3, both on the ramp; memory 1 (5, 1): 4, 3,
    // mask 1; memory 2 (3, 3): 0 (m = 1, the ramp's edge, not counted), then -1;
    // memory 3 (0, 4): -4 (m = 0, the other edge), -5. Sum on the ramp: -6.
    let spans = Tensor::from_slice(&[2.0f64, 5.0, 3.0, 0.0]).view([1, 4]);
    let counter = Tensor::from_slice(&[4.0f64, 1.0, 3.0, 4.0]).view([1, 4]);
    let usable = Tensor::ones([1, 1, 4], (Kind::Bool, tch::Device::Cpu));
    let loss = loss_of(&spans, &counter, &usable, 4.0, 2, 0.5).double_value(&[]);
    assert!((loss - 0.5 * (-6.0) / 4.0 / 2.0).abs() < 1e-12, "{loss}");
    // Averaged over streams: a second stream with no memory on the ramp halves it.
    let spans2 = Tensor::cat(&[&spans, &Tensor::full([1, 4], 10.0, (Kind::Double, tch::Device::Cpu))], 0);
    let counter2 = Tensor::cat(&[&counter, &counter.zeros_like()], 0);
    let usable2 = Tensor::ones([2, 1, 4], (Kind::Bool, tch::Device::Cpu));
    let loss2 = loss_of(&spans2, &counter2, &usable2, 4.0, 2, 0.5).double_value(&[]);
    assert!((loss2 - loss / 2.0).abs() < 1e-12, "{loss2}");
    // A memory the queries may not see (another episode, padding) does not count.
    let hidden = Tensor::from_slice(&[false, true, true, true]).view([1, 1, 4]);
    let loss3 = loss_of(&spans, &counter, &hidden, 4.0, 2, 0.5).double_value(&[]);
    assert!((loss3 - -0.5 / 4.0 / 2.0).abs() < 1e-12, "{loss3}");
}

/// The loss through the counts equals the sum over every query-memory pair, in value
/// and in its gradient to the spans, on spans where many pairs are on the ramp.
#[test]
fn ramp_loss_through_counts_equals_the_sum_over_pairs() {
    let mut rng = lethe_core::rng::Rng::new(31);
    let (b, m, cached) = (3, 6, 9);
    let counter = compacted_counter(&mut rng, b, cached, m);
    let n = cached + m;
    let spans = (rng.uniform_tensor(&[b, n], Kind::Double) * 30.0).set_requires_grad(true);
    let usable = rng.uniform_tensor(&[b, 1, n], Kind::Double).gt(0.2);
    let ours = loss_of(&spans, &counter, &usable, 8.0, m, 1e-3);
    let reference = reference_ramp_loss(&spans, &counter, &usable, 8.0, m, 1e-3);
    assert!(reference.double_value(&[]).abs() > 1e-4, "some pairs are on the ramp");
    assert!((&ours - &reference).abs().double_value(&[]) < 1e-15, "{ours:?} vs {reference:?}");
    let g = Tensor::run_backward(&[ours], &[&spans], false, false);
    let g_ref = Tensor::run_backward(&[reference], &[&spans], false, false);
    assert!(g[0].allclose(&g_ref[0], 1e-15, 1e-15, false));
    assert!(g[0].abs().sum(Kind::Double).double_value(&[]) > 0.0);
}

#[test]
fn batch_policy_drops_the_common_dead_prefix_in_whole_blocks() {
    // Dead prefixes of 5 and 7 slots: the minimum 5 rounds down to 4 with blocks of 2.
    let mut k = vec![false; 5];
    k.extend([true; 4]);
    k.extend([false; 7]);
    k.extend([true; 2]);
    let keep = Tensor::from_slice(&k).view([2, 9]);
    assert_eq!(batch_min_drop(&keep, 2), 4);
    assert_eq!(batch_min_drop(&keep, 3), 3);
}

/// `memory.expire.budget`: of the memories the spans keep, each stream keeps the
/// `budget` with the most remaining span; a stream that keeps fewer keeps them all.
#[test]
fn a_budget_keeps_the_memories_with_the_most_remaining_span() {
    let kept =
        Tensor::from_slice(&[true, true, false, true, true, true, true, true, false, false, true, false]).view([3, 4]);
    let remaining = Tensor::from_slice(&[3.0f32, 1.0, 9.0, 2.0, 0.5, 5.0, 4.0, 1.0, 7.0, 8.0, 2.0, 6.0]).view([3, 4]);
    let got = within_budget(&kept, &remaining, 2);
    let want = Tensor::from_slice(&[true, false, false, true, false, true, true, false, false, false, true, false])
        .view([3, 4]);
    assert!(got.equal(&want), "kept {got:?}");
    assert!(within_budget(&kept, &remaining, 4).equal(&kept), "a budget of every slot changed what was kept");
}
