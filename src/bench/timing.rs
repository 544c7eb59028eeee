//! The timed steps of one config: a [`Stepper`] (the model, its memories, optimiser and
//! batches) and [`Timed`], which runs and times its steps, alone or a round at a time.

use super::*;

/// A config being timed: its model, optimiser and memories (the memory filled and the
/// warm-up done by [`Timed::prepare`]), and the step times so far, round by round.
pub(crate) struct Timed<'a> {
    pub(crate) run: Stepper<'a>,
    pub(crate) batches: Batches,
    /// Where the parameters came from (`--init-from`).
    pub(crate) init: Option<Init>,
    pub(crate) fill_blocks: usize,
    /// Seconds of each timed step, and in the all-reduce, over every round.
    pub(crate) times: Vec<f64>,
    pub(crate) comm: Vec<f64>,
    /// The median step of each round.
    pub(crate) round_medians: Vec<f64>,
    /// The loss of the last step timed.
    pub(crate) last_loss: f64,
    /// After each timed step: the memory size per layer, and the step's FLOPs.
    pub(crate) memory: Vec<Vec<f64>>,
    pub(crate) flops: Vec<f64>,
    /// States held per stream and layer now, before the next step: what it attends over.
    pub(crate) held: Vec<usize>,
    /// The states per stream and layer the next step's products run over ([`counted`]).
    pub(crate) counted: Vec<usize>,
    /// The phase times of the profiled steps so far, and how many steps they are over.
    pub(crate) profiled: Vec<crate::profile::PhaseTime>,
    pub(crate) profiled_steps: usize,
}

impl<'a> Timed<'a> {
    /// Builds `cfg`'s model, fills its memory and runs the untimed warm-up steps. Starts
    /// a new peak of the resident memory first.
    pub(crate) fn prepare(cfg: &'a Config, opts: &BenchOptions, group: Option<&'a ProcessGroup>) -> Result<Self> {
        cfg.validate()?;
        opts.validate()?;
        let device = crate::device::for_training(&cfg.train.device, cfg.train.threads, cfg.train.tf32)?;
        // The data first: a corpus that cannot be read is refused before a model is built.
        let mut batches = Batches::new(cfg, opts.train_data)?;
        reset_peak_rss();
        crate::device::reset_gpu_peak(device);
        let lm = Lm::new(cfg, device)?;
        // `--init-from`: the trained parameters; those the source lacks (another
        // mechanism's), or has in another shape (a position table over another span),
        // start fresh and are reported.
        let init = match &cfg.train.init_from {
            Some(from) => Some(Init {
                from: from.display().to_string(),
                fresh: crate::model::init::load_fitting(&lm, from)?.fresh,
            }),
            None => None,
        };
        let opt = Optimiser::new(crate::model::trainable(lm.named_parameters(), cfg.train.freeze_base), &cfg.train);
        let mems = (0..cfg.train.accum).map(|_| lm.model.new_memory()).collect();
        let mut run = Stepper { lm, opt, mems, cfg, group, steps: 0, frozen: opts.frozen };
        let fill_blocks = fill_memory(&mut run, &mut batches, opts.context)?;
        for _ in 0..opts.warmup {
            stop_check(group)?;
            let batch = batches.next(cfg);
            run.step(&batch)?;
        }
        synchronize(device);
        let (held, counted) = held_by(&run);
        Ok(Timed {
            run,
            batches,
            init,
            fill_blocks,
            times: vec![],
            comm: vec![],
            round_medians: vec![],
            last_loss: f64::NAN,
            memory: vec![],
            flops: vec![],
            held,
            counted,
            profiled: vec![],
            profiled_steps: 0,
        })
    }

    /// Times `steps` more training steps, one round; with `stoppable`, a signal stops it
    /// at the next step ([`stop_check`]).
    pub(crate) fn round(&mut self, steps: usize, stoppable: bool) -> Result<()> {
        let device = self.run.lm.device();
        let mut times = Vec::with_capacity(steps.min(MAX_BENCH_STEPS));
        for _ in 0..steps {
            if stoppable {
                stop_check(self.run.group)?;
            }
            let batch = self.batches.next(self.run.cfg);
            let start = Instant::now();
            let s = self.run.step(&batch)?;
            synchronize(device);
            times.push(start.elapsed().as_secs_f64());
            self.comm.push(s.comm_s);
            self.last_loss = s.nll_sum / s.weight;
            self.record_memory();
        }
        self.round_medians.push(Timing::of(times.clone()).median_s);
        self.times.extend(times);
        Ok(())
    }

    /// After a timed step (its time taken already), which attended over the states held
    /// before it: the memory it saw per layer, and its FLOPs; then the states held now.
    pub(crate) fn record_memory(&mut self) {
        self.flops.push(step_flops(self.run.cfg, &self.counted, self.run.lm.device()));
        let reports = self.run.mems[0].reports();
        self.memory.push(reports.iter().map(|r| r.mem_size).collect());
        (self.held, self.counted) = held_by(&self.run);
    }

    /// Runs `steps` more steps with every phase timed, recorded by libtorch's profiler
    /// into the Chrome trace `trace` when given, and adds them to the profile so far.
    pub(crate) fn profile(&mut self, steps: usize, trace: Option<&Path>) -> Result<()> {
        let phases = profile_steps(&mut self.run, steps, &mut self.batches, trace)?;
        crate::profile::merge(&mut self.profiled, phases);
        self.profiled_steps += steps;
        // The profiled steps trained too: the next round starts from what they left.
        (self.held, self.counted) = held_by(&self.run);
        Ok(())
    }

    /// The figures over every round timed, after the profiled steps of `opts.profile`.
    pub(crate) fn finish(mut self, opts: &BenchOptions) -> Result<BenchResult> {
        let (cfg, group) = (self.run.cfg, self.run.group);
        // Under torchrun rank 0 traces for the group (the ranks run the same operations).
        let trace = opts
            .trace
            .as_ref()
            .filter(|_| group.is_none_or(|g| g.rank() == 0))
            .map(|dir| dir.join(format!("trace-{}.json", cfg.name)));
        // In rounds, every round has profiled its steps already.
        if opts.profile && self.profiled_steps == 0 {
            self.profile(opts.steps, trace.as_deref())?;
        }
        let profile = opts.profile.then_some(self.profiled);
        let steps = self.times.len();
        let t = Timing::of(self.times);
        let comm_s = Timing::of(self.comm).median_s;
        let tokens = cfg.train.batch * cfg.train.block;
        let flops = mean(&self.flops);
        let mem_size = column_means(&self.memory);
        let mem_by_step = self.memory.iter().map(|m| mean(m)).collect();
        Ok(BenchResult {
            name: cfg.name.clone(),
            mechanism: cfg.memory.mechanism.name().to_string(),
            precision: cfg.train.precision.name().to_string(),
            knob: None,
            value: None,
            span: cfg.memory.span,
            parameters: self.run.lm.parameter_count(),
            tokens_per_step: tokens,
            steps,
            median_s: t.median_s,
            p10_s: t.p10_s,
            p90_s: t.p90_s,
            round_medians_s: self.round_medians,
            relative: None,
            last_loss: self.last_loss,
            batches: self.batches.describe().to_string(),
            frozen: self.run.frozen,
            init: self.init,
            tokens_per_s: tokens as f64 / t.median_s,
            peak_rss_mib: peak_rss_bytes().map(|b| b as f64 / (1024.0 * 1024.0)),
            peak_gpu_mib: crate::device::gpu_memory(self.run.lm.device()).map(|m| m.peak as f64 / (1024.0 * 1024.0)),
            mem_size,
            mem_by_step,
            held: self.held,
            flops_per_step: flops,
            gflops: flops / t.median_s / 1e9,
            mfu: None,
            threads: tch::get_num_threads(),
            ranks: group.map_or(1, ProcessGroup::world_size),
            comm_s,
            fill_blocks: self.fill_blocks,
            context_tokens: self.fill_blocks * cfg.train.block,
            profile,
            profile_steps: self.profiled_steps,
        })
    }
}

/// What the bench's training steps run on: the model, its optimiser, the memories of
/// its micro-batches, the config, and the process group under torchrun.
pub(crate) struct Stepper<'a> {
    pub(crate) lm: Lm,
    pub(crate) opt: Optimiser,
    pub(crate) mems: Vec<crate::model::Memory>,
    pub(crate) cfg: &'a Config,
    pub(crate) group: Option<&'a ProcessGroup>,
    /// Optimisation steps taken.
    pub(crate) steps: usize,
    /// Steps at a learning rate of 0 ([`BenchOptions::frozen`]).
    pub(crate) frozen: bool,
}

impl Stepper<'_> {
    /// One optimisation step on `batch` at the config's learning rate (0 when frozen),
    /// its draws from libtorch's generator (dropout, span noise) seeded as training
    /// seeds them, so that the step does not depend on what ran before it in the process.
    pub(crate) fn step(&mut self, batch: &Batch) -> Result<crate::train::StepStats> {
        let (_, _seed) = begin_step(self.cfg, self.steps);
        self.steps += 1;
        let lr = if self.frozen { 0.0 } else { self.cfg.train.lr };
        optimisation_step(
            &self.lm,
            &mut self.opt,
            &mut self.mems,
            batch,
            &self.cfg.train,
            Scales { lr, aux: 1.0 },
            self.group,
        )
    }
}
