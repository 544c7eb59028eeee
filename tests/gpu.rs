//! lethe on a GPU against lethe on the CPU, the reference every other test checks.
//!
//! - A seed builds the same parameters on either device (they are drawn on the CPU).
//! - Every mechanism's loss and gradients over four blocks, memory carried, agree with
//!   the CPU's to float32 rounding: the GPU takes other paths (libtorch's fused
//!   `scaled_dot_product_attention`, Adaptive-Span's whole window, Expire-Span's bias
//!   from its CUDA kernels and its compaction without the CPU's fused kernels, the
//!   optimiser's libtorch update); Expire-Span's written-out path too.
//! - Expire-Span's CUDA kernels (its bias, its deletion) give what the CPU's loops of
//!   the same arithmetic give.
//! - A training run follows the CPU's step by step; the fixture GPT-2 gives the logits of
//!   `transformers`; a tiny Expire-Span model learns the copy task.
//! - `train.tf32` rounds the GPU's float32 products to TensorFloat-32, and only when on.
//! - A pretrained decoder read onto the GPU reads as on the CPU under every key-value
//!   cache policy, and an Expire-Span run's learned cache too.
//!
//! These run where libtorch sees a GPU. Elsewhere (CI has none) each test prints that it
//! skipped, unless `LETHE_REQUIRE_GPU=1`, where it fails: `scripts/gpu-check.sh` sets it.

mod common;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use lethe::config::{Config, Mechanism};
use lethe::model::{token_nll, Lm};
use tch::{Device, Kind, Tensor};

/// Serialises this file's tests: `train.tf32` is a flag of the whole process, and the
/// tests that compare with the CPU must not run while another has it on.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The first GPU and this file's lock, or None (with a line saying the test skipped)
/// where there is no GPU.
fn gpu(test: &str) -> Option<(Device, MutexGuard<'static, ()>)> {
    match lethe::device::parse("cuda") {
        Ok(device) => Some((device, ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))),
        Err(e) => {
            let required = std::env::var("LETHE_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "LETHE_REQUIRE_GPU=1 but {e}");
            eprintln!("{test}: skipped, {e}");
            None
        }
    }
}

/// Largest absolute difference of `a` and `b` over the largest absolute value of `a`.
fn relative_gap(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_device(Device::Cpu).to_kind(Kind::Double), b.to_device(Device::Cpu).to_kind(Kind::Double));
    let gap = (&a - &b).abs().max().double_value(&[]);
    gap / a.abs().max().double_value(&[]).max(1e-12)
}

/// A model of 2 layers x 32 on random bytes with `mechanism`, sized so that four blocks
/// of 8 fill and then move every memory (spans of 16-32, compression, the long-term
/// memory's contraction). No dropout: its masks come from each device's own generator.
fn mechanism_config(mechanism: Mechanism, sticky: bool) -> Config {
    let mut c = common::tiny_config();
    (c.model.layers, c.model.d_model, c.model.heads, c.model.d_ffn) = (2, 32, 2, 64);
    c.model.dropout = 0.0;
    c.memory.mechanism = mechanism;
    c.memory.span = match mechanism {
        Mechanism::Fixed => 16,
        Mechanism::Adaptive | Mechanism::Expire => 32,
        Mechanism::Compressive | Mechanism::Infinity => 8,
    };
    (c.memory.expire.ramp, c.memory.expire.init_fraction, c.memory.expire.alpha) = (4, 0.5, 0.1);
    (c.memory.compressive.rate, c.memory.compressive.slots) = (2, 4);
    (c.memory.infinity.basis, c.memory.infinity.samples, c.memory.infinity.bins) = (8, 16, 8);
    c.memory.infinity.widths = vec![0.1, 0.3];
    c.memory.infinity.sticky = sticky;
    c.memory.infinity.kl_coef = 0.01;
    c
}

/// Per-block losses (task + auxiliary), the memory held after each block, and the
/// gradients of their sum by parameter name, of four blocks of `tokens` on `lm`.
fn four_blocks(lm: &Lm, tokens: &Tensor, targets: &Tensor) -> (Vec<f64>, Vec<usize>, Vec<(String, Tensor)>) {
    let device = lm.device();
    let mut mem = lm.model.new_memory();
    let (mut losses, mut held, mut total) = (vec![], vec![], Tensor::zeros([], (Kind::Float, device)));
    for block in 0..4 {
        let x = tokens.narrow(1, block * 8, 8).to_device(device);
        let y = targets.narrow(1, block * 8, 8).to_device(device);
        let out = lm.model.forward(&x, &mut mem, true).unwrap();
        let loss = token_nll(&out.logits, &y).mean(Kind::Float) + out.aux_loss;
        losses.push(loss.double_value(&[]));
        held.push(mem.reports().iter().map(|r| r.held).sum());
        total += loss;
    }
    total.backward();
    let grads =
        lm.named_parameters().into_iter().filter(|(_, p)| p.grad().defined()).map(|(n, p)| (n, p.grad())).collect();
    (losses, held, grads)
}

#[test]
fn a_seed_builds_the_same_parameters_on_the_gpu_as_on_the_cpu() {
    let Some((gpu, _one)) = gpu("parameters") else { return };
    for &mechanism in Mechanism::all() {
        let cfg = mechanism_config(mechanism, false);
        let (cpu_lm, gpu_lm) = (Lm::new(&cfg, Device::Cpu).unwrap(), Lm::new(&cfg, gpu).unwrap());
        assert_eq!(gpu_lm.device(), gpu);
        for ((name, a), (other, b)) in cpu_lm.named_parameters().iter().zip(gpu_lm.named_parameters()) {
            assert_eq!(name, &other);
            assert_eq!(b.device(), gpu, "{mechanism}: {name}");
            assert!(a.equal(&b.to_device(Device::Cpu)), "{mechanism}: {name} differs");
        }
    }
}

#[test]
fn every_mechanism_computes_on_the_gpu_what_it_computes_on_the_cpu() {
    let Some((gpu, _one)) = gpu("mechanisms") else { return };
    let tokens = common::random_tokens(5, 256, &[4, 32]); // (b, 4 blocks of 8)
    let targets = common::random_tokens(6, 256, &[4, 32]);
    // Each mechanism as configured by default (Expire-Span through its bias kernels), then
    // the ∞-former's sticky memories and Expire-Span's written-out path.
    let cases = Mechanism::all()
        .iter()
        .map(|&m| (m, false, false))
        .chain([(Mechanism::Infinity, true, false), (Mechanism::Expire, false, true)]);
    let mut worst: f64 = 0.0;
    for (mechanism, sticky, written_out) in cases {
        let mut cfg = mechanism_config(mechanism, sticky);
        cfg.memory.expire.fused = !written_out;
        let (cpu_lm, gpu_lm) = (Lm::new(&cfg, Device::Cpu).unwrap(), Lm::new(&cfg, gpu).unwrap());
        if mechanism == Mechanism::Expire {
            // Spans that differ from memory to memory, so that some expire in four blocks.
            for lm in [&cpu_lm, &gpu_lm] {
                common::randomise(&lm.vs, 17, 1.0, |name| name.ends_with("expire.w"));
            }
        }
        let (cpu_losses, cpu_held, cpu_grads) = four_blocks(&cpu_lm, &tokens, &targets);
        let (gpu_losses, gpu_held, gpu_grads) = four_blocks(&gpu_lm, &tokens, &targets);
        let label = match (mechanism, sticky, written_out) {
            (_, true, _) => format!("{mechanism} (sticky)"),
            (_, _, true) => format!("{mechanism} (written out)"),
            (Mechanism::Expire, _, _) => format!("{mechanism} (bias kernels)"),
            _ => mechanism.to_string(),
        };
        let gaps: Vec<(String, f64)> =
            cpu_grads.iter().zip(&gpu_grads).map(|((name, a), (_, b))| (name.clone(), relative_gap(a, b))).collect();
        let largest = gaps.iter().map(|g| g.1).fold(0.0, f64::max);
        println!("{label}: losses {cpu_losses:?} (CPU) {gpu_losses:?} (GPU), held {cpu_held:?} / {gpu_held:?}, largest gradient gap {largest:.2e}");
        assert_eq!(cpu_held, gpu_held, "{label}: memories held after each block");
        for (block, (a, b)) in cpu_losses.iter().zip(&gpu_losses).enumerate() {
            assert!((a - b).abs() <= 2e-5 * a.abs(), "{label}: block {block} loss {a} on the CPU, {b} on the GPU");
        }
        assert_eq!(cpu_grads.len(), gpu_grads.len(), "{label}: parameters with a gradient");
        for (name, gap) in gaps {
            assert!(gap < 1e-4, "{label}: gradient of {name} differs by {gap:.2e} of its largest entry");
        }
        worst = worst.max(largest);
    }
    println!("largest gradient gap over all mechanisms: {worst:.2e} of a parameter's largest entry");
}

/// Expire-Span's bias kernels (`liblethe_cuda.so`, loaded from beside this binary or
/// `LETHE_CUDA_KERNELS`) give what the CPU's loops of the same arithmetic give: the
/// bias, the ramp counts and distances, the span loss, and the gradients to the
/// positions and spans (the loss's included),
/// over 70 queries (three query chunks of the backward pass, the last one short) and
/// keys usable per stream or per query. Under `LETHE_REQUIRE_GPU=1` the library must
/// load.
#[test]
fn expire_span_s_bias_kernels_compute_on_the_gpu_what_the_cpu_does() {
    use lethe::model::memory::expire_bias::{expire_bias, runs_on};
    let Some((gpu, _one)) = gpu("bias kernels") else { return };
    let loaded = runs_on(gpu).expect("the kernels load or are absent");
    let required = std::env::var("LETHE_REQUIRE_GPU").is_ok_and(|v| v == "1");
    assert!(loaded || !required, "LETHE_REQUIRE_GPU=1 but no liblethe_cuda.so beside the test binary");
    if !loaded {
        eprintln!("skipped: no liblethe_cuda.so (scripts/build-cuda.sh)");
        return;
    }
    let mut rng = lethe::rng::Rng::new(21);
    let (b, h, m, cached, p) = (3, 4, 70, 130, 60);
    let n = cached + m;
    // Each stream's cache at distinct distances (stream s every s + 1 steps), the block last.
    let counter: Vec<f32> = (0..b)
        .flat_map(|s| (0..cached).map(move |j| ((cached - j) * (s + 1)) as f32).chain((0..m).map(|j| -(j as f32))))
        .collect();
    let counter = Tensor::from_slice(&counter).view([b, n]);
    let spans = rng.uniform_tensor(&[b, n], Kind::Float) * 200.0;
    let positions = rng.normal_tensor(&[b, h, m, p], Kind::Float);
    for usable in
        [rng.uniform_tensor(&[b, 1, n], Kind::Float).gt(0.1), rng.uniform_tensor(&[b, m, n], Kind::Float).gt(0.1)]
    {
        let weights = rng.normal_tensor(&[b, h, m, n], Kind::Float);
        let run = |device: Device| {
            let pq = positions.to_device(device).set_requires_grad(true);
            let e = spans.to_device(device).set_requires_grad(true);
            let out =
                expire_bias(&pq, &e, &counter.to_device(device), &usable.to_device(device), 16.0, Some(0.01)).unwrap();
            let seen = out.bias.isfinite();
            let loss = out.loss.unwrap();
            let objective =
                (out.bias.where_scalarother(&seen, 0.0) * weights.to_device(device)).sum(Kind::Float) + &loss;
            let grads = Tensor::run_backward(&[objective], &[&pq, &e], false, false);
            let (counts, distances) = out.ramp.unwrap();
            let cpu = |t: &Tensor| t.to_device(Device::Cpu);
            (cpu(&out.bias), cpu(&seen), cpu(&counts), cpu(&distances), cpu(&grads[0]), cpu(&grads[1]), cpu(&loss))
        };
        let (cb, cs, cc, cd, cp, ce, cl) = run(Device::Cpu);
        let (gb, gs, gc, gd, gp, ge, gl) = run(gpu);
        assert!(cs.equal(&gs), "the pairs seen");
        let seen = cs.sum(Kind::Int64).int64_value(&[]);
        assert!(seen > 1000 && seen < b * h * m * n - 1000, "the case has pairs seen and not: {seen}");
        let finite = |t: &Tensor| t.where_scalarother(&cs, 0.0);
        let gaps = [
            ("bias", relative_gap(&finite(&cb), &finite(&gb))),
            ("distances", relative_gap(&cd, &gd)),
            ("span loss", relative_gap(&cl, &gl)),
            ("positions' gradient", relative_gap(&cp, &gp)),
            ("spans' gradient", relative_gap(&ce, &ge)),
        ];
        println!("bias kernels, usable {:?}: {gaps:?}, ramp counts equal: {}", usable.size(), cc.equal(&gc));
        assert!(cc.equal(&gc), "ramp counts");
        for (what, gap) in gaps {
            assert!(gap < 1e-5, "{what} differs by {gap:.2e} of its largest entry");
        }
    }
}

/// Expire-Span's deletion kernels (`compact::forget`: the keep decision, each stream's
/// kept slots right-aligned, the next block's room) keep on the GPU, to the bit and to the
/// padding, what their loops keep on the CPU: streams that keep everything, nothing, and
/// some, over more slots than the planning kernel has threads (each thread a run of them).
#[test]
fn expire_span_s_deletion_kernels_keep_on_the_gpu_what_the_cpu_does() {
    use lethe::model::memory::compact::forget;
    use lethe::model::memory::expire_bias::runs_on;
    let Some((gpu, _one)) = gpu("deletion kernels") else { return };
    if !runs_on(gpu).expect("the kernels load or are absent") {
        let required = std::env::var("LETHE_REQUIRE_GPU").is_ok_and(|v| v == "1");
        assert!(!required, "LETHE_REQUIRE_GPU=1 but no liblethe_cuda.so beside the test binary");
        eprintln!("skipped: no liblethe_cuda.so (scripts/build-cuda.sh)");
        return;
    }
    let mut rng = lethe::rng::Rng::new(23);
    for (b, n, d, m, kind) in [(5, 700, 64, 64, Kind::Float), (3, 9, 3, 4, Kind::Float), (4, 300, 8, 16, Kind::Double)]
    {
        let states = rng.normal_tensor(&[b, n, d], kind);
        let spans = (rng.uniform_tensor(&[b, n], Kind::Double) * n as f64)
            .index_fill(0, &Tensor::from_slice(&[1i64]), 10.0 * n as f64)
            .index_fill(0, &Tensor::from_slice(&[2i64]), 0.0)
            .to_kind(kind);
        let counter = (Tensor::arange_start_step(n, 0, -1, (Kind::Double, Device::Cpu)) - 3.0)
            .unsqueeze(0)
            .expand([b, n], false)
            .to_kind(kind)
            .contiguous();
        let valid = rng.uniform_tensor(&[b, n], Kind::Double).gt(0.1);
        let run = |device: Device| {
            let f = forget(
                &states.to_device(device),
                &spans.to_device(device),
                &counter.to_device(device),
                &valid.to_device(device),
                4.0,
                m,
            )
            .unwrap();
            let cpu = |t: &Tensor| t.to_device(Device::Cpu);
            (cpu(&f.states), cpu(&f.counter), cpu(&f.valid))
        };
        let (cpu, on_gpu) = (run(Device::Cpu), run(gpu));
        println!(
            "deletion kernels, (b, n) = ({b}, {n}): {} of {} slots kept in the widest stream",
            cpu.1.size()[1] - m,
            n
        );
        assert!(cpu.0.equal(&on_gpu.0), "(b, n) = ({b}, {n}): the kept states");
        assert!(cpu.1.equal(&on_gpu.1), "(b, n) = ({b}, {n}): the counters");
        assert!(cpu.2.equal(&on_gpu.2), "(b, n) = ({b}, {n}): the validity");
    }
}

#[test]
fn a_training_run_on_the_gpu_follows_the_cpu_run() {
    let Some((gpu, _one)) = gpu("training") else { return };
    let dir = tempfile::tempdir().unwrap();
    for mechanism in [Mechanism::Fixed, Mechanism::Expire, Mechanism::Infinity] {
        let mut cfg = mechanism_config(mechanism, false);
        cfg.train.steps = 30;
        let mut losses = vec![];
        for (run, device) in ["cpu".to_string(), lethe::device::name(gpu)].into_iter().enumerate() {
            cfg.name = format!("{mechanism}-{run}");
            cfg.train.device = device;
            losses.push(lethe::train::train(&cfg, &common::quiet(dir.path())).unwrap().losses);
        }
        assert_eq!(losses[0].len(), 30);
        let gaps: Vec<f64> = losses[0].iter().zip(&losses[1]).map(|(a, b)| (a - b).abs() / a.abs()).collect();
        let largest = gaps.iter().cloned().fold(0.0, f64::max);
        println!("{mechanism}: 30 steps, loss {:.5} -> {:.5} on the CPU, {:.5} on the GPU; largest relative gap {largest:.2e}", losses[0][0], losses[0][29], losses[1][29]);
        assert!(largest < 1e-3, "{mechanism}: the GPU's losses left the CPU's by {largest:.2e}");
        assert!(losses[1][29] < losses[1][0], "{mechanism}: the GPU run did not lower its loss");
    }
}

/// The fixture GPT-2 (2 layers of 32, from `scripts/gpt2-fixture.py`), found where the
/// tests were built or, for a test binary carried to another machine, in the folder it
/// runs in.
fn gpt2_fixture() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-tiny");
    if built.is_dir() {
        built
    } else {
        PathBuf::from("tests/fixtures/gpt2-tiny")
    }
}

#[test]
fn gpt2_on_the_gpu_gives_the_logits_of_transformers() {
    let Some((gpu, _one)) = gpu("gpt2") else { return };
    let fixture = gpt2_fixture();
    let mut cfg = Config::default();
    lethe::model::init::adopt(&mut cfg, &fixture).unwrap();
    cfg.memory.span = 0;
    cfg.train.block = 8;
    let lm = Lm::new(&cfg, gpu).unwrap();
    lethe::model::init::load(&lm, &fixture).unwrap();
    let mut expected: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(fixture.join("expected.safetensors")).unwrap().into_iter().collect();
    let (ids, want) = (expected.remove("ids").unwrap(), expected.remove("logits").unwrap());
    let mut mem = lm.model.new_memory();
    let got = tch::no_grad(|| lm.model.forward(&ids.to_device(gpu), &mut mem, false)).unwrap().logits;
    assert_eq!(got.device(), gpu);
    let diff = (got.to_device(Device::Cpu) - &want).abs().max().double_value(&[]);
    println!("GPT-2 fixture on the GPU: largest logit difference from transformers {diff:.2e}");
    assert!(diff < 1e-4, "largest difference {diff}");
}

#[test]
fn expire_span_learns_the_copy_task_on_the_gpu() {
    let Some((gpu, _one)) = gpu("learning") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::copy_learning_config("gpu-expire");
    cfg.train.device = lethe::device::name(gpu);
    cfg.memory.mechanism = Mechanism::Expire;
    cfg.memory.span = 64;
    (cfg.memory.expire.ramp, cfg.memory.expire.init_fraction, cfg.memory.expire.alpha) = (8, 0.9, 0.01);
    let result = common::train_and_eval(&cfg, dir.path());
    let answers = result.answer_accuracy.unwrap();
    let mem = result.mem_size.iter().sum::<f64>() / result.mem_size.len() as f64;
    println!("Expire-Span on the GPU: answers {answers:.3} (chance 0.25), memory {mem:.1} a layer (distance 24-32)");
    assert!(answers > 0.6, "Expire-Span on the GPU answered {answers}");
    assert!(mem < 0.6 * 24.0, "average memory {mem}");
}

#[test]
fn tf32_rounds_the_gpu_s_products_only_when_asked() {
    let Some((gpu, _one)) = gpu("tf32") else { return };
    let (a, b) = (common::randn(1, &[512, 512], Kind::Float), common::randn(2, &[512, 512], Kind::Float));
    let exact = a.to_kind(Kind::Double).matmul(&b.to_kind(Kind::Double));
    let product = || a.to_device(gpu).matmul(&b.to_device(gpu));
    lethe::device::set_tf32(false).unwrap();
    let ieee = relative_gap(&exact, &product());
    lethe::device::set_tf32(true).unwrap();
    let on = lethe::device::tf32();
    let tf32 = relative_gap(&exact, &product());
    lethe::device::set_tf32(false).unwrap();
    println!("512 x 512 product on the GPU: float32 off by {ieee:.2e}, TF32 by {tf32:.2e} of the largest entry");
    assert!(on, "libtorch does not report TF32 on");
    assert!(ieee < 1e-5, "float32 product off by {ieee}");
    assert!(tf32 > 10.0 * ieee && tf32 < 1e-2, "TF32 product off by {tf32} (float32 {ieee})");
}

/// `lethe bench`'s GPU figure is libtorch's caching allocator's: 64 MiB allocated show
/// in the current and the peak bytes, and after the tensor is freed a reset brings the
/// peak back down to what is allocated then.
#[test]
fn the_allocator_counts_what_the_gpu_holds_and_its_peak_resets() {
    let Some((device, _lock)) = gpu("the_allocator_counts_what_the_gpu_holds_and_its_peak_resets") else { return };
    let mib = 1u64 << 20;
    let before = lethe::device::gpu_memory(device).expect("the CUDA allocator's figures");
    let held = Tensor::zeros([16 * 1024 * 1024], (Kind::Float, device)); // 64 MiB
    let during = lethe::device::gpu_memory(device).unwrap();
    assert!(during.current >= before.current + 64 * mib, "{before:?} then {during:?}");
    assert!(during.peak >= during.current);
    drop(held);
    lethe::device::reset_gpu_peak(device);
    let after = lethe::device::gpu_memory(device).unwrap();
    assert!(after.current + 64 * mib <= during.current && after.peak < during.peak, "{during:?} then {after:?}");
    eprintln!("allocator: {before:?}, with 64 MiB {during:?}, freed and reset {after:?}");
}

/// Training under bfloat16 autocast on the GPU (`train.precision = "bf16"`): every
/// mechanism's 50 steps of `copy-sweep-tiny` track float32's on the same GPU, within the
/// bounds the CPU's test (`tests/it/precision.rs`) holds to, and the checkpoint stays
/// float32.
#[test]
fn bfloat16_training_on_the_gpu_tracks_float32_for_every_mechanism() {
    let Some((gpu, _one)) = gpu("bfloat16") else { return };
    let dir = tempfile::tempdir().unwrap();
    for &mechanism in Mechanism::all() {
        let run = |precision: lethe::config::Precision| {
            let mut c = Config::preset("copy-sweep-tiny").unwrap();
            c.name = format!("{}-{}", mechanism.name(), precision.name());
            c.memory.mechanism = mechanism;
            (c.train.steps, c.train.log_every, c.train.eval_every) = (50, 10, 0);
            c.train.precision = precision;
            c.train.device = lethe::device::name(gpu);
            let start = std::time::Instant::now();
            let summary = lethe::train::train(&c, &common::quiet(dir.path())).unwrap();
            (summary, start.elapsed().as_secs_f64())
        };
        let ((full, full_s), (half, half_s)) =
            (run(lethe::config::Precision::F32), run(lethe::config::Precision::Bf16));
        let (a, b) = (full.last_eval.unwrap().loss, half.last_eval.unwrap().loss);
        let gap = (a - b).abs() / a;
        let last = |l: &[f64]| l[l.len() - 10..].iter().sum::<f64>() / 10.0;
        let (ta, tb) = (last(&full.losses), last(&half.losses));
        println!(
            "{mechanism}: valid loss f32 {a:.4}, bf16 {b:.4} (gap {gap:.5}); last 10 steps {ta:.4} / {tb:.4}; 50 steps {full_s:.1} s / {half_s:.1} s"
        );
        assert!(gap < 0.02, "{mechanism}: bfloat16 validation loss {b:.4} vs float32's {a:.4}");
        assert!((ta - tb).abs() / ta < 0.06, "{mechanism}: last 10 training losses {tb:.4} vs {ta:.4}");
        assert_ne!(full.losses, half.losses, "{mechanism}: bfloat16 changed nothing");
        let ckpt = lethe::checkpoint::Checkpoint::load(&half.run_dir).unwrap();
        assert!(
            ckpt.parameters().iter().all(|(_, t)| t.kind() == Kind::Float),
            "{mechanism}: a bf16 checkpoint tensor"
        );
    }
}

/// The Llama fixture `name`, found where the tests were built or in the folder a carried
/// test binary runs in (as [`gpt2_fixture`]).
fn llama_fixture(name: &str) -> PathBuf {
    let built = common::llama::fixture(name);
    match built.is_dir() {
        true => built,
        false => PathBuf::from("tests/fixtures/llama").join(name),
    }
}

/// A pretrained decoder read onto the GPU (`Llama::load_on`) reads as on the CPU under
/// every cache policy, a block of the prompt then token by token, its caches keeping the
/// same entries there; a cache held on the CPU is refused by it in one line. An
/// Expire-Span run made from parameters on the GPU decodes there, its learned cache
/// (uncapped, and capped at a budget) as on the CPU.
#[test]
fn a_pretrained_decoder_on_the_gpu_reads_as_on_the_cpu_under_every_policy() {
    use lethe::model::kv::{Budget, Policy};
    use lethe::model::llama::{ExpireRun, KvCache, Llama};
    let Some((gpu, _one)) = gpu("decoder") else { return };
    let on_cpu = Llama::load(&llama_fixture("llama3")).unwrap();
    let on_gpu = Llama::load_on(&llama_fixture("llama3"), gpu).unwrap();
    assert_eq!(on_gpu.device(), gpu);
    let ids = common::random_tokens(5, 300, &[2, 40]);
    let read = |model: &Llama, cache: &mut KvCache| {
        let mut parts = vec![model.forward(&ids.narrow(1, 0, 16), cache)];
        parts.extend((16..40).map(|t| model.forward(&ids.narrow(1, t, 1), cache)));
        Tensor::cat(&parts, 1)
    };
    for spec in ["full", "window", "streaming", "h2o", "tova", "snapkv:window=6"] {
        let policy = match spec {
            "full" => Policy::default(),
            spec => Policy::parse(spec, Some(Budget::Entries(12)), 40).unwrap(),
        };
        let (mut here, mut there) = (KvCache::new(policy.clone()), KvCache::new(policy));
        let (want, got) = (read(&on_cpu, &mut here), read(&on_gpu, &mut there));
        assert_eq!(got.device(), gpu, "{spec}: logits");
        let gap = relative_gap(&want, &got);
        println!("decoder under {spec}: the GPU's logits within {gap:.2e} of the CPU's");
        assert!(gap < 1e-4, "{spec}: the GPU's logits differ from the CPU's by {gap:.2e}");
        assert_eq!(there.entries(), here.entries(), "{spec}: entries held");
        assert_eq!(there.check_fits(&on_gpu), Ok(()));
        let why = here.check_fits(&on_gpu).unwrap_err();
        assert!(why.contains("on cpu, the model runs on cuda:"), "{spec}: {why}");
    }
    let mut cfg = Config::default();
    cfg.model.arch = lethe::config::Arch::Llama;
    (cfg.model.vocab, cfg.model.layers, cfg.model.d_model, cfg.model.heads, cfg.model.d_ffn) = (256, 2, 16, 4, 24);
    (cfg.model.llama.kv_heads, cfg.model.llama.qk_norm) = (2, true);
    (cfg.memory.mechanism, cfg.memory.span, cfg.train.block) = (Mechanism::Expire, 12, 4);
    (cfg.memory.expire.ramp, cfg.memory.expire.init_fraction, cfg.memory.expire.per_head) = (2, 0.4, true);
    cfg.validate().unwrap();
    let _seed = lethe::rng::seed_torch(7);
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    common::randomise(&lm.vs, 17, 1.0, |name| name.ends_with("expire.w"));
    let params = lm.vs.variables();
    let moved = params.iter().map(|(name, t)| (name.clone(), t.to_device(gpu))).collect();
    let (run_cpu, run_gpu) = (ExpireRun::new(&cfg, &params).unwrap(), ExpireRun::new(&cfg, &moved).unwrap());
    assert_eq!(run_gpu.decoder().device(), gpu);
    let ids = common::random_tokens(6, 256, &[2, 40]);
    for budget in [0, 3] {
        let (mut here, mut there) = (run_cpu.cache_at(budget).unwrap(), run_gpu.cache_at(budget).unwrap());
        let read = |model: &Llama, cache: &mut KvCache| {
            let mut parts = vec![model.forward(&ids.narrow(1, 0, 4), cache)];
            parts.extend((4..40).map(|t| model.forward(&ids.narrow(1, t, 1), cache)));
            Tensor::cat(&parts, 1)
        };
        let (want, got) = (read(run_cpu.decoder(), &mut here), read(run_gpu.decoder(), &mut there));
        let gap = relative_gap(&want, &got);
        println!("Expire-Span's learned cache at budget {budget}: the GPU's logits within {gap:.2e} of the CPU's");
        assert!(gap < 1e-4, "learned cache at budget {budget}: the GPU's logits differ by {gap:.2e}");
        assert_eq!(there.entries(), here.entries(), "learned cache at budget {budget}: entries held");
    }
}

/// A pretrained decoder read onto the GPU in bfloat16 or float16 (`Llama::load_as`)
/// computes as `transformers` does in that precision (the fixture's logits,
/// scripts/llama-precision-fixture.py): a prompt under the full cache as its sdpa
/// attention, token by token as its eager one, on average within half the distance
/// between transformers' half-precision and float32 logits (the GPU's kernels round
/// otherwise than the CPU's, where lethe's equal them to the bit); the cache is held in
/// that precision there.
#[test]
fn a_pretrained_decoder_in_half_precision_on_the_gpu_computes_as_transformers_does() {
    use lethe::config::train::Precision;
    use lethe::model::llama::{KvCache, Llama};
    let Some((gpu, _one)) = gpu("decoder") else { return };
    let read = |path: PathBuf| -> std::collections::HashMap<String, Tensor> {
        Tensor::read_safetensors(path).unwrap().into_iter().collect()
    };
    let mean_gap = |a: &Tensor, b: &Tensor| (a - b).abs().mean(Kind::Double).double_value(&[]);
    for name in ["llama3", "smollm2", "mistral", "qwen2", "qwen3"] {
        let folder = llama_fixture(name);
        let want32 = read(folder.join("expected.safetensors"));
        let ids = want32["ids"].to_device(gpu);
        for precision in [Precision::Bf16, Precision::F16] {
            let want = read(folder.join(format!("expected-{}.safetensors", precision.name())));
            let model = Llama::load_as(&folder, gpu, precision).unwrap();
            let prompt = model.forward(&ids, &mut KvCache::default()).to_device(Device::Cpu);
            let mut cache = KvCache::default();
            let steps: Vec<Tensor> = (0..20).map(|t| model.forward(&ids.narrow(1, t, 1), &mut cache)).collect();
            let steps = Tensor::cat(&steps, 1).to_device(Device::Cpu);
            let held = &cache.layers[0].as_ref().unwrap().keys;
            assert_eq!((held.kind(), held.device()), (precision.kind(), gpu), "{name}: the cache");
            for (how, got, theirs) in [("prompt", &prompt, "logits_sdpa"), ("token by token", &steps, "logits")] {
                let rounding = mean_gap(&want[theirs], &want32["logits"]);
                let off = mean_gap(got, &want[theirs]);
                println!(
                    "decoder {name} in {} on the GPU, {how}: {off:.2e} from transformers on average, its own rounding {rounding:.2e}",
                    precision.name()
                );
                assert!(off < 0.5 * rounding, "{name} in {}, {how}: {off:.2e} from transformers", precision.name());
            }
        }
    }
}
