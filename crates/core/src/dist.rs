//! Several processes as one: PyTorch's distributed engine (c10d), as `torchrun` starts it.
//!
//! `torchrun` (or any launcher that sets the same variables) starts one process per
//! rank with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` in its
//! environment; [`Launch::from_env`] reads them (none set: a plain single process).
//! [`ProcessGroup::join`] meets the other ranks through c10d's `TCPStore` — torchrun's own
//! store when `TORCHELASTIC_USE_AGENT_STORE=True`, otherwise one that rank 0 hosts — and
//! builds a Gloo process group for CPU tensors. Collectives (all-reduce, broadcast,
//! barrier) give up after the group's timeout with an error that names the rank, so a
//! dead peer ends every other rank with a message and a non-zero exit, never a hang.
//!
//! tch does not bind c10d and no maintained crate does for libtorch 2.11, so
//! lethe-kernels' `csrc/dist.cpp` (compiled by its `build.rs` against the torch wheel's headers) is a small
//! C interface over libtorch's own `TCPStore` and `ProcessGroupGloo`; this module is its
//! safe wrapper.

use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::NonNull;
use std::time::Duration;

use tch::{Device, Tensor};

use crate::error::{LetheError, Result};
use lethe_kernels::{
    lethe_dist_all_reduce, lethe_dist_barrier, lethe_dist_broadcast, lethe_dist_free, lethe_dist_init, DistOptions,
    RawGroup,
};

/// Where this process stands in a launch, as the launcher's environment says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank, `0..world_size` (`RANK`).
    pub rank: usize,
    /// Number of processes (`WORLD_SIZE`).
    pub world_size: usize,
    /// Rank on this machine (`LOCAL_RANK`; default: `rank`), which picks the GPU.
    pub local_rank: usize,
    /// Host of the rendezvous store (`MASTER_ADDR`).
    pub master_addr: String,
    /// Port of the rendezvous store (`MASTER_PORT`).
    pub master_port: u16,
    /// The store is torchrun's agent's (`TORCHELASTIC_USE_AGENT_STORE=True`): every rank
    /// is a client. Otherwise rank 0 hosts it.
    pub agent_store: bool,
    /// torchrun's restart count (`TORCHELASTIC_RESTART_COUNT`), which keeps the keys of
    /// a restarted group apart from the last attempt's.
    pub restart: usize,
}

impl Launch {
    /// The launch this process is part of, or `None` when `WORLD_SIZE` is not set
    /// (a plain `lethe` command: one process).
    pub fn from_env() -> Result<Option<Launch>> {
        Launch::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`Launch::from_env`], reading the variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
        let Some(world) = var("WORLD_SIZE") else { return Ok(None) };
        let number = |name: &str, text: Option<String>| -> Result<usize> {
            let text = text.ok_or_else(|| invalid_launch(format!("WORLD_SIZE is set but {name} is not")))?;
            text.trim().parse().map_err(|_| invalid_launch(format!("{name}={text:?} is not a whole number")))
        };
        let world_size = number("WORLD_SIZE", Some(world))?;
        let rank = number("RANK", var("RANK"))?;
        if world_size == 0 || rank >= world_size {
            return Err(invalid_launch(format!("RANK={rank} is not below WORLD_SIZE={world_size}")));
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(text) => number("LOCAL_RANK", Some(text))?,
            None => rank,
        };
        let master_addr =
            var("MASTER_ADDR").ok_or_else(|| invalid_launch("WORLD_SIZE is set but MASTER_ADDR is not".into()))?;
        let port = number("MASTER_PORT", var("MASTER_PORT"))?;
        let master_port =
            u16::try_from(port).map_err(|_| invalid_launch(format!("MASTER_PORT={port} is not a port")))?;
        let agent_store = var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let restart = var("TORCHELASTIC_RESTART_COUNT")
            .map(|t| number("TORCHELASTIC_RESTART_COUNT", Some(t)))
            .transpose()?
            .unwrap_or(0);
        Ok(Some(Launch { rank, world_size, local_rank, master_addr, master_port, agent_store, restart }))
    }

    /// Whether this process hosts the rendezvous store.
    fn hosts_store(&self) -> bool {
        self.rank == 0 && !self.agent_store
    }

    /// The key prefix of this process's `n`-th group in the store (torchrun's, then
    /// lethe's own with the group's number, so that a process that joins twice, as a
    /// bench of several configs does, never reads the keys of its last group).
    fn prefix(&self, n: usize) -> String {
        if self.agent_store {
            format!("/worker/attempt_{}/lethe/{n}", self.restart)
        } else {
            format!("lethe/{n}")
        }
    }
}

fn invalid_launch(reason: String) -> LetheError {
    LetheError::Invalid(format!("launch environment: {reason} (start lethe with torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"))
}

/// Groups this process has joined so far: every rank joins its groups in the same
/// order, so the count names the same group on all of them.
static JOINED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A joined process group: every rank of the launch, with Gloo collectives on CPU tensors.
pub struct ProcessGroup {
    raw: NonNull<RawGroup>,
    rank: usize,
    world_size: usize,
}

// The C++ process group is built to be driven from any thread (c10d runs its work on its
// own threads); lethe drives it from one thread at a time (`&mut self` is not needed
// because every collective waits for its own completion).
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Meets the other ranks of `launch` and builds the group. The rendezvous and every
    /// collective give up after `timeout`.
    pub fn join(launch: &Launch, timeout: Duration) -> Result<ProcessGroup> {
        let host = CString::new(launch.master_addr.as_str())
            .map_err(|_| invalid_launch("MASTER_ADDR holds a NUL byte".into()))?;
        let prefix = CString::new(launch.prefix(JOINED.fetch_add(1, std::sync::atomic::Ordering::SeqCst)))
            .map_err(|_| invalid_launch("the store prefix holds a NUL byte".into()))?;
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let mut error = std::ptr::null_mut();
        // SAFETY: the strings outlive the call; `error` receives a malloc'ed message or stays null.
        let raw = unsafe {
            let options = DistOptions {
                host: host.as_ptr(),
                port: c_int::from(launch.master_port),
                rank: launch.rank as c_int,
                world: launch.world_size as c_int,
                store_server: c_int::from(launch.hosts_store()),
                prefix: prefix.as_ptr(),
                timeout_ms,
            };
            lethe_dist_init(&options, &mut error)
        };
        let rank = launch.rank;
        match NonNull::new(raw) {
            Some(raw) => Ok(ProcessGroup { raw, rank, world_size: launch.world_size }),
            None => Err(LetheError::Distributed {
                rank,
                reason: format!(
                    "could not join the group of {} through the store at {}:{}: {}",
                    launch.world_size,
                    launch.master_addr,
                    launch.master_port,
                    // SAFETY: the message `lethe_dist_init` wrote, taken once.
                    unsafe { lethe_kernels::take_error(error) }
                ),
            }),
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Replaces `tensor` (a contiguous CPU tensor) on every rank by its sum over the ranks.
    pub fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
        self.all_reduce(tensor, false)
    }

    /// Replaces `tensor` (a contiguous CPU tensor) on every rank by its elementwise
    /// maximum over the ranks.
    pub fn all_reduce_max(&self, tensor: &mut Tensor) -> Result<()> {
        self.all_reduce(tensor, true)
    }

    fn all_reduce(&self, tensor: &mut Tensor, max: bool) -> Result<()> {
        self.check(tensor, "all-reduce")?;
        let ptr = tensor.as_mut_ptr() as *mut c_void;
        // SAFETY: `ptr` is a live at::Tensor for the duration of the call.
        self.status("all-reduce", |error| unsafe {
            lethe_dist_all_reduce(self.raw.as_ptr(), ptr, c_int::from(max), error)
        })
    }

    /// Replaces `tensor` on every rank by rank `root`'s.
    pub fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        self.check(tensor, "broadcast")?;
        let ptr = tensor.as_mut_ptr() as *mut c_void;
        // SAFETY: as in `all_reduce_sum`.
        self.status("broadcast", |error| unsafe { lethe_dist_broadcast(self.raw.as_ptr(), ptr, root as c_int, error) })
    }

    /// Returns once every rank has reached it.
    pub fn barrier(&self) -> Result<()> {
        // SAFETY: the group is live.
        self.status("barrier", |error| unsafe { lethe_dist_barrier(self.raw.as_ptr(), error) })
    }

    /// Gloo takes contiguous CPU tensors; lethe reduces flat buffers, so anything else
    /// is a bug in the caller, reported as an error rather than a crash in C++.
    fn check(&self, tensor: &Tensor, what: &str) -> Result<()> {
        if tensor.device() != Device::Cpu || !tensor.is_contiguous() {
            return Err(LetheError::Distributed {
                rank: self.rank,
                reason: format!(
                    "{what} needs a contiguous CPU tensor, got one on {}",
                    crate::device::name(tensor.device())
                ),
            });
        }
        Ok(())
    }

    /// Runs a C call that returns 0 or -1 with a message.
    fn status(&self, what: &str, call: impl FnOnce(*mut *mut c_char) -> c_int) -> Result<()> {
        lethe_kernels::status(call).map_err(|message| LetheError::Distributed {
            rank: self.rank,
            reason: format!("{what} failed (is a peer gone?): {message}"),
        })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `lethe_dist_init` and is freed once.
        unsafe { lethe_dist_free(self.raw.as_ptr()) }
    }
}

/// Floats per all-reduce when gradients are reduced in buckets (16 MiB of f32): few
/// calls, each large enough to keep the links busy, none holding a second copy of a
/// large model at once.
pub const BUCKET_ELEMENTS: i64 = 4 << 20;

impl ProcessGroup {
    /// Sums `values` over the ranks (in f64) and returns the sums.
    pub fn sum_f64(&self, values: &[f64]) -> Result<Vec<f64>> {
        let mut t = Tensor::from_slice(values);
        self.all_reduce_sum(&mut t)?;
        Vec::<f64>::try_from(&t)
            .map_err(|e| LetheError::Distributed { rank: self.rank, reason: format!("reading a reduced value: {e}") })
    }

    /// The elementwise maximum of `values` over the ranks.
    pub fn max_f64(&self, values: &[f64]) -> Result<Vec<f64>> {
        let mut t = Tensor::from_slice(values);
        self.all_reduce_max(&mut t)?;
        Vec::<f64>::try_from(&t)
            .map_err(|e| LetheError::Distributed { rank: self.rank, reason: format!("reading a reduced value: {e}") })
    }

    /// Whether `flag` is set on any rank: every rank gets the same answer, so that all
    /// of them take the same branch (stop on a signal, write a checkpoint).
    pub fn any(&self, flag: bool) -> Result<bool> {
        Ok(self.sum_f64(&[f64::from(u8::from(flag))])?[0] > 0.0)
    }

    /// Sums the gradients of `params` over the ranks, in place, in flat buckets of at
    /// most [`BUCKET_ELEMENTS`] floats (one all-reduce per bucket, not per tensor), and
    /// returns the sums of `figures` (the step's loss figures), reduced in the same call
    /// as the check that every rank holds a gradient for the same parameters (the error
    /// names the first that differs).
    pub fn sum_gradients(&self, params: &[(String, Tensor)], figures: &[f64]) -> Result<Vec<f64>> {
        let mut flags: Vec<f64> = params.iter().map(|(_, p)| f64::from(u8::from(p.grad().defined()))).collect();
        flags.extend(figures);
        let sums = self.sum_f64(&flags)?;
        let (counts, figures) = sums.split_at(params.len());
        let world = self.world_size as f64;
        if let Some(((name, _), _)) = params.iter().zip(counts).find(|(_, &c)| c != 0.0 && c != world) {
            return Err(LetheError::Distributed {
                rank: self.rank,
                reason: format!("parameter `{name}` has a gradient on some ranks only"),
            });
        }
        let grads: Vec<Tensor> = params.iter().map(|(_, p)| p.grad()).filter(Tensor::defined).collect();
        self.through_buckets(&grads, |flat| self.all_reduce_sum(flat))?;
        Ok(figures.to_vec())
    }

    /// Replaces every tensor of `tensors` by rank 0's, in flat buckets.
    pub fn broadcast_from_root(&self, tensors: &[Tensor]) -> Result<()> {
        self.through_buckets(tensors, |flat| self.broadcast(flat, 0))
    }

    /// Runs `collective` on each bucket of `tensors` flattened into one CPU tensor, then
    /// copies the result back into the tensors, in place.
    fn through_buckets(&self, tensors: &[Tensor], collective: impl Fn(&mut Tensor) -> Result<()>) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for bucket in buckets(tensors) {
            let flat: Vec<Tensor> = bucket.iter().map(|t| t.reshape([-1]).to_device(Device::Cpu)).collect();
            let mut flat = Tensor::cat(&flat, 0);
            collective(&mut flat)?;
            let mut offset = 0;
            for t in bucket {
                let n = t.numel() as i64;
                t.shallow_clone().copy_(&flat.narrow(0, offset, n).view_as(t).to_device(t.device()));
                offset += n;
            }
        }
        Ok(())
    }

    /// Every rank's `bytes`, in rank order, on every rank (two all-reduces: the lengths,
    /// then the bytes, each rank's at its own offset and zeros elsewhere).
    pub fn all_gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut lengths = vec![0.0; self.world_size];
        lengths[self.rank] = bytes.len() as f64;
        let lengths: Vec<usize> = self.sum_f64(&lengths)?.into_iter().map(|l| l as usize).collect();
        let offset: usize = lengths[..self.rank].iter().sum();
        let mut all = vec![0u8; lengths.iter().sum()];
        all[offset..offset + bytes.len()].copy_from_slice(bytes);
        let mut t = Tensor::from_slice(&all);
        self.all_reduce_sum(&mut t)?;
        let all = Vec::<u8>::try_from(&t)
            .map_err(|e| LetheError::Distributed { rank: self.rank, reason: format!("reading gathered bytes: {e}") })?;
        let mut start = 0;
        Ok(lengths
            .iter()
            .map(|&n| {
                let part = all[start..start + n].to_vec();
                start += n;
                part
            })
            .collect())
    }

    /// Every rank's named tensors, in rank order, on every rank (for checkpoints: each
    /// rank's memory). The names must already say whose each tensor is.
    pub fn all_gather_named(&self, named: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let fail = |what: &str, e: tch::TchError| LetheError::Distributed {
            rank: self.rank,
            reason: format!("{what} tensors to gather: {e}"),
        };
        let mut bytes = vec![];
        Tensor::save_multi_to_stream(named, &mut bytes).map_err(|e| fail("writing", e))?;
        let mut out = vec![];
        for part in self.all_gather_bytes(&bytes)? {
            out.extend(Tensor::load_multi_from_stream(std::io::Cursor::new(part)).map_err(|e| fail("reading", e))?);
        }
        Ok(out)
    }
}

/// `tensors` cut into runs of at most [`BUCKET_ELEMENTS`] elements (a larger tensor is
/// a bucket of its own).
fn buckets(tensors: &[Tensor]) -> Vec<&[Tensor]> {
    let mut out = vec![];
    let (mut start, mut size) = (0, 0);
    for (i, t) in tensors.iter().enumerate() {
        let n = t.numel() as i64;
        if size > 0 && size + n > BUCKET_ELEMENTS {
            out.push(&tensors[start..i]);
            (start, size) = (i, 0);
        }
        size += n;
    }
    if start < tensors.len() {
        out.push(&tensors[start..]);
    }
    out
}

/// The data-parallel group of a training (or bench) under torchrun, when the launch has
/// more than one rank; `None` for a single process. The batch must split evenly into
/// every rank's micro-batches (`train.batch` a multiple of ranks x `train.accum`).
///
/// Data-parallel ranks train on the CPU: their collectives are Gloo's. On a GPU every
/// rank would also take the same device (lethe does not yet map `LOCAL_RANK` to one)
/// and the gradients would cross host memory, so such a run is refused, before any
/// rank waits for another, until lethe builds c10d's NCCL group.
pub fn join_for_training(cfg: &crate::config::Config) -> Result<Option<ProcessGroup>> {
    let Some(launch) = Launch::from_env()? else { return Ok(None) };
    if launch.world_size == 1 {
        return Ok(None);
    }
    let device = crate::device::parse(&cfg.train.device)?;
    if device != Device::Cpu {
        let reason = format!("data-parallel training runs on the CPU (Gloo) for now, and train.device asks for {device:?}: set --device cpu, or train on one process");
        return Err(LetheError::Distributed { rank: launch.rank, reason });
    }
    let parts = launch.world_size * cfg.train.accum;
    if !cfg.train.batch.is_multiple_of(parts) {
        let reason = format!(
            "must split into {} ranks x {} micro-batches (train.accum): a multiple of {parts}",
            launch.world_size, cfg.train.accum
        );
        return Err(LetheError::config("train.batch", cfg.train.batch, reason));
    }
    ProcessGroup::join(&launch, std::time::Duration::from_secs(cfg.train.dist_timeout)).map(Some)
}

/// What [`self_check`] measured on one rank.
#[derive(Clone, Debug)]
pub struct SelfCheck {
    /// Elements per all-reduce.
    pub elements: usize,
    /// Median seconds of one all-reduce.
    pub all_reduce_s: f64,
    /// Seconds of the barrier after the rounds.
    pub barrier_s: f64,
}

/// Checks the group's collectives with known values: `rounds` all-reduces of
/// `elements` floats (rank `r` gives `r + 1`, so the sum is `n (n + 1) / 2`), a
/// broadcast of rank 0's values and a barrier. A wrong number is an error.
pub fn self_check(group: &ProcessGroup, elements: usize, rounds: usize) -> Result<SelfCheck> {
    if elements == 0 {
        return Err(LetheError::Invalid("the self-check needs at least one element".into()));
    }
    let n = group.world_size() as f64;
    let mut times = vec![];
    for _ in 0..rounds.max(1) {
        let mut t = Tensor::full([elements as i64], group.rank() as f64 + 1.0, (tch::Kind::Float, Device::Cpu));
        let start = std::time::Instant::now();
        group.all_reduce_sum(&mut t)?;
        times.push(start.elapsed().as_secs_f64());
        expect_all(group, &t, n * (n + 1.0) / 2.0, "all-reduce")?;
    }
    let mut t = Tensor::full([elements as i64], group.rank() as f64 + 10.0, (tch::Kind::Float, Device::Cpu));
    group.broadcast(&mut t, 0)?;
    expect_all(group, &t, 10.0, "broadcast")?;
    let start = std::time::Instant::now();
    group.barrier()?;
    let barrier_s = start.elapsed().as_secs_f64();
    times.sort_by(f64::total_cmp);
    Ok(SelfCheck { elements, all_reduce_s: times[times.len() / 2], barrier_s })
}

/// Fails unless every element of `t` is `value`.
fn expect_all(group: &ProcessGroup, t: &Tensor, value: f64, what: &str) -> Result<()> {
    let (lo, hi) = (t.min().double_value(&[]), t.max().double_value(&[]));
    if lo != value || hi != value {
        let reason = format!("{what} gave values in [{lo}, {hi}], expected {value} everywhere");
        return Err(LetheError::Distributed { rank: group.rank(), reason });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn no_world_size_means_a_single_process() {
        assert_eq!(Launch::from_vars(vars(&[("RANK", "0")])).unwrap(), None);
    }

    #[test]
    fn a_torchrun_environment_is_read_whole() {
        let env = [
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.2"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ];
        let l = Launch::from_vars(vars(&env)).unwrap().unwrap();
        assert_eq!(
            (l.rank, l.world_size, l.local_rank, l.master_port, l.agent_store, l.restart),
            (1, 4, 1, 29500, true, 2)
        );
        assert_eq!(l.master_addr, "10.0.0.2");
        assert!(!l.hosts_store());
        assert_eq!(l.prefix(0), "/worker/attempt_2/lethe/0");
    }

    #[test]
    fn without_the_agent_store_rank_0_hosts_it() {
        let env = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")];
        let l = Launch::from_vars(vars(&env)).unwrap().unwrap();
        assert!(l.hosts_store() && !l.agent_store);
        assert_eq!((l.local_rank, l.prefix(3).as_str()), (0, "lethe/3"));
    }

    #[test]
    fn an_inconsistent_environment_names_the_variable() {
        let cases: [(&[(&str, &str)], &str); 5] = [
            (&[("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")], "RANK is not"),
            (
                &[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")],
                "RANK=2 is not below WORLD_SIZE=2",
            ),
            (&[("WORLD_SIZE", "two"), ("RANK", "0")], "WORLD_SIZE=\"two\""),
            (&[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "1")], "MASTER_ADDR is not"),
            (
                &[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "70000")],
                "MASTER_PORT=70000 is not a port",
            ),
        ];
        for (env, needle) in cases {
            let msg = Launch::from_vars(vars(env)).unwrap_err().to_string();
            assert!(msg.contains(needle) && msg.contains("torchrun"), "expected `{needle}` in: {msg}");
        }
    }
}
