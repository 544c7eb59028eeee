use super::*;

#[test]
fn scale_parses_knobs_and_rejects_nonsense() {
    assert_eq!(parse_scale("span=64,128").unwrap(), Scale { knob: Knob::Span, values: vec![64, 128] });
    assert_eq!(parse_scale("context = 8192").unwrap().knob, Knob::Context);
    assert!(parse_scale("width=3").unwrap_err().to_string().contains("unknown knob `width`"));
    assert!(parse_scale("span=0").unwrap_err().to_string().contains("`0`"));
    assert!(parse_scale("span").unwrap_err().to_string().contains("KNOB=V1"));
}

/// A 1-layer model by hand: d = 4, f = 8, V = 10, blocks of m = 2, batch 3, span 5
/// (P = 6 position rows), 5 states held, so n = 7 keys.
#[test]
fn step_flops_match_a_hand_count() {
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.model.layers = 1;
    cfg.model.d_model = 4;
    cfg.model.heads = 1;
    cfg.model.d_ffn = 8;
    cfg.model.vocab = 10;
    cfg.train.block = 2;
    cfg.train.batch = 3;
    cfg.memory.span = 5;
    cfg.memory.mechanism = Mechanism::Fixed;
    // q, o: 2 * 2*2*16 = 128; ffn: 2 * 2*2*4*8 = 256; k, v: 2 * 2*7*16 = 448;
    // scores and mix: 2 * 2*2*7*4 = 224; positions: 2*2*6*4 = 96; head: 2*2*4*10 = 160
    let forward = 3.0 * (128.0 + 256.0 + 448.0 + 224.0 + 96.0 + 160.0);
    assert_eq!(step_flops(&cfg, &[5], Device::Cpu), 3.0 * forward);
    // More memory held costs more.
    assert!(step_flops(&cfg, &[50], Device::Cpu) > step_flops(&cfg, &[5], Device::Cpu));
    // An empty memory: n = 2 keys, so only 2 of the 6 position rows are used.
    let forward = 3.0 * (128.0 + 256.0 + 4.0 * 2.0 * 16.0 + 4.0 * 2.0 * 2.0 * 4.0 + 2.0 * 2.0 * 2.0 * 4.0 + 160.0);
    assert_eq!(step_flops(&cfg, &[0], Device::Cpu), 3.0 * forward);
    // Blocks of 128 over 64 states held, span 64: on the CPU the queries attend in two
    // chunks of 64, each over 128 keys (not 192), with 65 of the position rows.
    cfg.train.block = 128;
    cfg.memory.span = 64;
    let (q_o, ffn, k_v, head) =
        (4.0 * 128.0 * 16.0, 4.0 * 128.0 * 4.0 * 8.0, 4.0 * 192.0 * 16.0, 2.0 * 128.0 * 4.0 * 10.0);
    let chunks = 2.0 * (4.0 * 64.0 * 128.0 * 4.0 + 2.0 * 64.0 * 65.0 * 4.0);
    assert_eq!(step_flops(&cfg, &[64], Device::Cpu), 3.0 * 3.0 * (q_o + ffn + k_v + chunks + head));
    // On a GPU the whole block is one fused call: 128 queries over 192 keys, with 65
    // position rows (counted, not run: no GPU is needed).
    let whole = 4.0 * 128.0 * 192.0 * 4.0 + 2.0 * 128.0 * 65.0 * 4.0;
    assert_eq!(step_flops(&cfg, &[64], Device::Cuda(0)), 3.0 * 3.0 * (q_o + ffn + k_v + whole + head));
    // Expire-Span holding 20: causal chunks over 84 and 148 keys, each query scoring
    // all P = 65 position rows.
    cfg.memory.mechanism = Mechanism::Expire;
    let k_v = 4.0 * 148.0 * 16.0;
    let chunks = 4.0 * 64.0 * (84.0 + 148.0) * 4.0 + 2.0 * 2.0 * 64.0 * 65.0 * 4.0;
    assert_eq!(step_flops(&cfg, &[20], Device::Cpu), 3.0 * 3.0 * (q_o + ffn + k_v + chunks + head));
}

#[test]
fn plan_crosses_mechanisms_with_the_scaled_knob() {
    let base = Config::preset("copy-tiny").unwrap();
    let scale = parse_scale("span=32,64").unwrap();
    let cases = plan(&base, &["fixed".into(), "expire:128".into()], &[], Some(&scale), None).unwrap();
    assert_eq!(cases.len(), 4);
    assert_eq!(cases[0].cfg.memory.mechanism, Mechanism::Fixed);
    assert_eq!((cases[1].cfg.memory.span, cases[1].scaled), (64, Some((Knob::Span, 64))));
    assert_eq!(cases[2].cfg.memory.mechanism, Mechanism::Expire);
    let ctx = plan(&base, &[], &[], Some(&parse_scale("context=100").unwrap()), None).unwrap();
    assert_eq!((ctx.len(), ctx[0].context), (1, Some(100)));
    let err = plan(&base, &["fixed:16,32".into()], &[], None, None).unwrap_err().to_string();
    assert!(err.contains("one size"), "{err}");
    let err = plan(&base, &["lstm".into()], &[], None, None).unwrap_err().to_string();
    assert!(err.contains("unknown mechanism `lstm`"), "{err}");
}

#[test]
fn plan_times_each_mechanism_in_each_precision_asked_for() {
    let base = Config::preset("copy-tiny").unwrap();
    let both = [Precision::F32, Precision::Bf16];
    let cases = plan(&base, &["fixed".into(), "expire".into()], &both, None, None).unwrap();
    let got: Vec<_> = cases.iter().map(|c| (c.cfg.memory.mechanism, c.cfg.train.precision)).collect();
    assert_eq!(
        got,
        [
            (Mechanism::Fixed, Precision::F32),
            (Mechanism::Fixed, Precision::Bf16),
            (Mechanism::Expire, Precision::F32),
            (Mechanism::Expire, Precision::Bf16)
        ]
    );
    assert_eq!(Precision::parse(" bf16").unwrap(), Precision::Bf16);
    assert!(Precision::parse("fp8").unwrap_err().contains("f32, bf16 or f16"));
}

#[test]
fn percentiles_pick_the_nearest_rank_of_the_sorted_times() {
    // Sorted: 1..=10; ranks round(9 q): q 0.1 -> 1, 0.5 -> 4.5 -> 5, 0.9 -> 8.1 -> 8.
    let t = Timing::of(vec![5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 9.0, 8.0, 7.0, 6.0]);
    assert_eq!((t.p10_s, t.median_s, t.p90_s), (2.0, 6.0, 9.0));
    let one = Timing::of(vec![3.0]);
    assert_eq!((one.p10_s, one.median_s, one.p90_s), (3.0, 3.0, 3.0));
}

#[test]
fn attention_of_every_mechanism_can_be_timed() {
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.train.batch = 2;
    for m in ["fixed", "adaptive", "expire", "compressive", "infinity"] {
        cfg.memory.mechanism = Mechanism::parse(m).unwrap();
        let t = time_attention(&cfg, 2, 1).unwrap();
        assert!(t.median_s.is_finite() && t.median_s > 0.0, "{m}: {t:?}");
    }
    assert!(time_attention(&cfg, 0, 0).is_err());
}

#[test]
fn the_gemm_rate_is_positive_and_mfu_is_its_share() {
    let rate = gemm_rate(Device::Cpu);
    assert!(rate.is_finite() && rate > 0.0);
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.model.layers = 1;
    cfg.train.batch = 2;
    let r = bench(
        &cfg,
        &BenchOptions {
            steps: 2,
            rounds: 1,
            warmup: 0,
            context: None,
            profile: false,
            trace: None,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let r = with_mfu(r, rate);
    let mfu = r.mfu.unwrap();
    assert!((mfu - r.gflops / rate).abs() < 1e-12 && mfu > 0.0);
    assert_eq!(r.flops_per_step, step_flops(&cfg, &r.held, Device::Cpu));
    assert!(r.profile.is_none(), "no profile unless asked");
}

/// The FLOPs of Expire-Span's ragged path count each stream's kept memories (the
/// report's "kept", rounded), not the padded width held; every other path, and
/// Expire-Span with attention dropout or on a GPU, the states held.
#[test]
fn flops_count_the_kept_memories_of_the_ragged_path_only() {
    let report = crate::model::memory::MemoryReport {
        extra: vec![("kept".into(), 6.4)],
        ..crate::model::memory::MemoryReport::with_rows(vec![], 10)
    };
    let reports = [report.clone(), crate::model::memory::MemoryReport::with_rows(vec![], 7)];
    let mut cfg = Config::preset("enwik8-expire-tiny").unwrap();
    cfg.model.dropout = 0.0;
    assert_eq!(counted(&cfg, &reports, Device::Cpu), vec![6, 7]);
    assert_eq!(counted(&cfg, &reports, Device::Cuda(0)), vec![10, 7]);
    cfg.model.dropout = 0.1;
    assert_eq!(counted(&cfg, &reports, Device::Cpu), vec![10, 7]);
    cfg.model.dropout = 0.0;
    cfg.memory.mechanism = Mechanism::Fixed;
    assert_eq!(counted(&cfg, &reports, Device::Cpu), vec![10, 7]);
}

/// The memory figure is the mean over the timed steps, not the last step's: a
/// Transformer-XL window of 8 over blocks of 4, timed from an empty memory, sees
/// 0..3, then 4..7, then 8 earlier positions a query (1.5, 5.5, 8 and 8 on average).
#[test]
fn the_memory_figure_is_the_mean_over_the_timed_steps() {
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.memory.mechanism = Mechanism::Fixed;
    cfg.memory.span = 8;
    cfg.model.layers = 2;
    cfg.train.batch = 2;
    cfg.train.block = 4;
    let opts = BenchOptions {
        steps: 4,
        rounds: 1,
        warmup: 0,
        context: Some(0),
        profile: false,
        trace: None,
        ..Default::default()
    };
    let r = bench(&cfg, &opts, None).unwrap();
    assert_eq!(r.mem_by_step, vec![1.5, 5.5, 8.0, 8.0]);
    assert_eq!(r.mem_size, vec![5.75, 5.75]);
    assert_eq!(r.held, vec![8, 8], "the states held at the last step");
    // The FLOPs follow the states held step by step: 0, 4, 8 and 8 before each block.
    let by_held = [0, 4, 8, 8].map(|h| step_flops(&cfg, &[h, h], Device::Cpu));
    assert_eq!(r.flops_per_step, by_held.iter().sum::<f64>() / 4.0);
    assert!(by_held[0] < by_held[3]);
}

/// The parameters of a timed config before and after `steps` timed steps of `opts`.
fn parameters_around_steps(cfg: &Config, opts: &BenchOptions) -> (Vec<Tensor>, Vec<Tensor>, BenchResult) {
    let mut timed = Timed::prepare(cfg, opts, None).unwrap();
    let params = |t: &Timed| t.run.lm.named_parameters().into_iter().map(|(_, p)| p.copy()).collect::<Vec<_>>();
    let before = params(&timed);
    timed.round(opts.steps, false).unwrap();
    let after = params(&timed);
    (before, after, timed.finish(opts).unwrap())
}

/// Frozen steps compute a whole training step, the optimiser's included, and leave
/// every parameter as it was, so a learned span keeps its size; the same steps
/// unfrozen move the parameters.
#[test]
fn frozen_steps_leave_the_parameters_as_they_are() {
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.memory.mechanism = Mechanism::Expire;
    cfg.model.layers = 1;
    cfg.train.batch = 2;
    let opts = BenchOptions { steps: 3, warmup: 1, frozen: true, ..Default::default() };
    let (before, after, r) = parameters_around_steps(&cfg, &opts);
    assert!(before.iter().zip(&after).all(|(a, b)| a.equal(b)), "a frozen step moved a parameter");
    assert!(r.frozen && r.last_loss.is_finite() && r.steps == 3);
    let (before, after, r) = parameters_around_steps(&cfg, &BenchOptions { frozen: false, ..opts });
    assert!(before.iter().zip(&after).all(|(a, b)| !a.equal(b)), "an unfrozen step left a parameter where it was");
    assert!(!r.frozen);
}

/// `--init-from` benches the trained parameters, not fresh ones: a checkpoint's
/// parameters, each changed from its initialisation, are the model's when timing
/// starts (frozen, so they are still there after the steps).
#[test]
fn init_from_benches_the_trained_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.model.layers = 1;
    cfg.train.batch = 2;
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    tch::no_grad(|| {
        lm.named_parameters().into_iter().for_each(|(_, mut p)| {
            let _ = p.g_add_scalar_(0.5);
        })
    });
    let path = dir.path().join("checkpoint.safetensors");
    let state = crate::checkpoint::TrainState::new(10, &(), 0).unwrap();
    crate::checkpoint::save(&path, &cfg, &state, &lm.named_parameters()).unwrap();
    let trained: Vec<Tensor> = lm.named_parameters().into_iter().map(|(_, p)| p.copy()).collect();
    cfg.train.init_from = Some(path);
    let opts = BenchOptions { steps: 1, warmup: 0, frozen: true, ..Default::default() };
    let (before, after, r) = parameters_around_steps(&cfg, &opts);
    assert!(
        trained.iter().zip(&before).all(|(a, b)| a.equal(b)),
        "the bench did not start from the checkpoint's parameters"
    );
    assert!(before.iter().zip(&after).all(|(a, b)| a.equal(b)));
    assert!(r.init.as_ref().is_some_and(|i| i.fresh.is_empty()), "{:?}", r.init);
    // Another mechanism beside it: Expire-Span's position table covers one block (33
    // rows against the window's 129) and its span predictor is its own; those start
    // fresh, said by name, and the rest is the checkpoint's.
    cfg.memory.mechanism = Mechanism::Expire;
    let mut timed = Timed::prepare(&cfg, &opts, None).unwrap();
    let by_name: std::collections::HashMap<String, Tensor> = lm.named_parameters().into_iter().collect();
    let fresh = timed.init.clone().unwrap().fresh;
    assert_eq!(fresh, ["key_pe", "layers.0.attn.expire.b", "layers.0.attn.expire.w"]);
    for (name, p) in timed.run.lm.named_parameters() {
        assert_eq!(by_name.get(&name).is_some_and(|t| t.equal(&p)), !fresh.contains(&name), "{name}");
    }
    timed.round(1, false).unwrap();
}

/// With the training data, each micro-batch's memory is filled with its own streams
/// of each block, cut as a training step cuts the batch: the same states as running
/// the model over those slices by hand.
#[test]
fn the_data_fills_each_micro_batch_s_memory_with_its_own_streams() {
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.model.layers = 1;
    cfg.train.batch = 4;
    cfg.train.accum = 2;
    cfg.memory.span = 64; // two blocks of 32 fill it
    let opts = BenchOptions { steps: 1, warmup: 0, train_data: true, ..Default::default() };
    let timed = Timed::prepare(&cfg, &opts, None).unwrap();
    assert_eq!(timed.fill_blocks, 2);
    let lm = &timed.run.lm;
    let mut streams = crate::task::train_streams(&cfg, cfg.train.batch).unwrap();
    let mut by_hand: Vec<_> = (0..2).map(|_| lm.model.new_memory()).collect();
    let _guard = tch::no_grad_guard();
    for _ in 0..2 {
        let batch = streams.next_batch();
        for (i, mem) in by_hand.iter_mut().enumerate() {
            let (x, _, _) = batch.tensors(2 * i, 2 * i + 2, Device::Cpu);
            lm.model.forward(&x, mem, false).unwrap();
        }
    }
    for (filled, hand) in timed.run.mems.iter().zip(&by_hand) {
        let (a, b) = (filled.state(), hand.state());
        assert!(!a.is_empty() && a.len() == b.len());
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            assert!(x.equal(y), "{name}");
        }
    }
    // The two micro-batches read different streams.
    assert!(!timed.run.mems[0].state()[0].1.equal(&timed.run.mems[1].state()[0].1));
}

/// `--profile` times the phases of the step, down to the memory's own, and each
/// phase's children take no longer than it does.
#[test]
fn a_profile_has_every_phase_of_the_step_nested_in_it() {
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.memory.mechanism = Mechanism::Expire;
    cfg.model.layers = 2;
    cfg.train.batch = 2;
    let r = bench(
        &cfg,
        &BenchOptions {
            steps: 2,
            rounds: 1,
            warmup: 0,
            context: None,
            profile: true,
            trace: None,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let phases = r.profile.unwrap();
    let find = |name: &str| phases.iter().find(|p| p.name() == name).unwrap_or_else(|| panic!("no phase {name}"));
    assert_eq!(find("step").calls, 2);
    assert_eq!(find("step > backward").calls, 2);
    assert_eq!(find("step > forward > layer").calls, 4, "two layers, two steps");
    let attend = find("step > forward > layer > memory attend");
    assert_eq!(find("step > forward > layer > memory attend > attention").calls, 4);
    assert_eq!(find("step > forward > layer > memory update > deletion").calls, 4);
    for p in &phases {
        let children: f64 = phases
            .iter()
            .filter(|c| c.path.len() == p.path.len() + 1 && c.path.starts_with(&p.path))
            .map(|c| c.seconds)
            .sum();
        assert!(children <= p.seconds, "{} takes {} s, its phases {children} s", p.name(), p.seconds);
    }
    assert!(attend.seconds > 0.0);
}

/// `--trace` writes libtorch's profile of the profiled steps: a Chrome trace that
/// holds the forward operations, the autograd nodes of the backward pass, and
/// Expire-Span's fused attention among them.
#[test]
fn a_trace_records_every_operation_of_the_profiled_steps() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.memory.mechanism = Mechanism::Expire;
    cfg.train.batch = 2;
    let opts = BenchOptions {
        steps: 2,
        rounds: 1,
        warmup: 0,
        context: None,
        profile: true,
        trace: Some(dir.path().join("traces")),
        ..Default::default()
    };
    bench(&cfg, &opts, None).unwrap();
    let path = dir.path().join("traces").join(format!("trace-{}.json", cfg.name));
    let events: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
    let count = |part: &str| names.iter().filter(|n| n.contains(part)).count();
    assert!(count("aten::") > 100, "{} libtorch operations", count("aten::"));
    assert!(count("autograd::engine::evaluate_function") > 10, "the backward pass's nodes");
    assert_eq!(
        count("evaluate_function: torch::autograd::CppNode<(anonymous namespace)::ExpireAttend>"),
        2 * cfg.model.layers,
        "the fused attention's backward, once a layer and step"
    );
    assert!(events.iter().all(|e| e["dur"].as_f64().is_some_and(|d| d >= 0.0)));
    let left: Vec<_> = std::fs::read_dir(dir.path().join("traces")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from(format!("trace-{}.json", cfg.name))],
        "the finished trace alone, no .partial file"
    );
    // A trace without the profile is refused before anything runs.
    let refused = BenchOptions { profile: false, ..opts.clone() };
    assert!(refused.validate().unwrap_err().to_string().contains("--trace needs --profile"));
    // A trace longer than the profiler can hold in memory is refused too.
    let long = BenchOptions { steps: MAX_TRACE_STEPS + 1, ..opts.clone() };
    assert!(long.validate().unwrap_err().to_string().contains(&format!("at most {MAX_TRACE_STEPS} (--bench-steps)")));
    assert!(BenchOptions { steps: MAX_TRACE_STEPS, ..opts }.validate().is_ok());
}
