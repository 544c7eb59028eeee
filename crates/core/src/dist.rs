//! Several processes as one: PyTorch's distributed engine (c10d), as `torchrun` starts it.
//!
//! `torchrun` (or any launcher that sets the same variables) starts one process per
//! rank with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` in its
//! environment; [`Launch::from_env`] reads them (none set: a plain single process).
//! [`ProcessGroup::join`] meets the other ranks through c10d's `TCPStore` — torchrun's own
//! store when `TORCHELASTIC_USE_AGENT_STORE=True`, otherwise one that rank 0 hosts — and
//! builds the group's collectives ([`Backend`]): Gloo's on CPU tensors, or NCCL's on one
//! GPU a rank. Collectives (all-reduce, broadcast, barrier) give up after the group's
//! timeout with an error that names the rank, so a dead peer ends every other rank with
//! a message and a non-zero exit, never a hang. In training,
//! [`ProcessGroup::overlap_gradients`] puts c10d's `Reducer` (the engine of PyTorch's
//! DistributedDataParallel) on the trainable parameters, so that their gradients are
//! summed bucket by bucket while the backward pass computes the rest.
//!
//! tch does not bind c10d and no maintained crate does for libtorch 2.11, so
//! lethe-kernels' `csrc/dist.cpp` (compiled by its `build.rs` against the torch wheel's
//! headers) is a small C interface over libtorch's own `TCPStore`, `ProcessGroupGloo` and
//! `ProcessGroupNCCL`; this module is its safe wrapper. `ProcessGroupNCCL` is part of
//! libtorch's CUDA library, which lethe does not link, so its constructor is a library of
//! its own, [`NCCL_LIBRARY`] (`csrc/nccl/`, built by `scripts/build-nccl.sh`), loaded
//! when a group asks for NCCL: from `LETHE_NCCL`, or beside the `lethe` executable.

use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::NonNull;
use std::time::Duration;

use tch::{Device, Tensor};

use crate::config::train::DistBackend;
use crate::error::{LetheError, Result};
use lethe_kernels::{
    lethe_dist_all_reduce, lethe_dist_barrier, lethe_dist_broadcast, lethe_dist_free, lethe_dist_init,
    lethe_dist_nccl_load, DistOptions, RawGroup,
};

/// The file name of the library of NCCL groups.
pub const NCCL_LIBRARY: &str = "liblethe_nccl.so";

/// The variable that names the library of NCCL groups' path.
pub const NCCL_LIBRARY_VAR: &str = "LETHE_NCCL";

/// The collectives of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// c10d's Gloo, on CPU tensors.
    Gloo,
    /// c10d's NCCL, on tensors of this rank's GPU.
    Nccl {
        /// The CUDA device's index.
        device: usize,
    },
}

impl Backend {
    /// Where the tensors of the group's collectives live.
    pub fn device(self) -> Device {
        match self {
            Backend::Gloo => Device::Cpu,
            Backend::Nccl { device } => Device::Cuda(device),
        }
    }

    /// The backend's name, as c10d gives it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Gloo => "Gloo",
            Backend::Nccl { .. } => "NCCL",
        }
    }
}

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

    /// Whether `MASTER_ADDR` names a host this machine can find: c10d's store would try
    /// an unknown name again and again, saying nothing, until its timeout.
    fn check_host(&self) -> Result<()> {
        use std::net::ToSocketAddrs;
        let addrs = (self.master_addr.as_str(), self.master_port).to_socket_addrs();
        match addrs.map(|mut a| a.next().is_some()) {
            Ok(true) => Ok(()),
            Ok(false) => Err(invalid_launch(format!("MASTER_ADDR={:?} has no address", self.master_addr))),
            Err(e) => Err(invalid_launch(format!(
                "MASTER_ADDR={:?} is not a host this machine can find ({e})",
                self.master_addr
            ))),
        }
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

/// A joined process group: every rank of the launch, with Gloo's collectives on CPU
/// tensors or NCCL's on this rank's GPU.
pub struct ProcessGroup {
    raw: NonNull<RawGroup>,
    rank: usize,
    world_size: usize,
    backend: Backend,
    /// The trainable parameters' reducer, once [`ProcessGroup::overlap_gradients`] made it.
    reducer: Option<Reducer>,
}

// The C++ process group is built to be driven from any thread (c10d runs its work on its
// own threads); lethe drives it from one thread at a time (`&mut self` is not needed
// because every collective waits for its own completion).
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Meets the other ranks of `launch` and builds the group, with `backend`'s
    /// collectives (NCCL's library loaded first). The rendezvous and every collective
    /// give up after `timeout`.
    pub fn join(launch: &Launch, timeout: Duration, backend: Backend) -> Result<ProcessGroup> {
        let device = match backend {
            Backend::Gloo => -1,
            Backend::Nccl { device } => {
                load_nccl().map_err(|reason| LetheError::Distributed { rank: launch.rank, reason })?;
                device as c_int
            }
        };
        launch.check_host()?;
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
                device,
            };
            lethe_dist_init(&options, &mut error)
        };
        let rank = launch.rank;
        match NonNull::new(raw) {
            Some(raw) => Ok(ProcessGroup { raw, rank, world_size: launch.world_size, backend, reducer: None }),
            None => Err(LetheError::Distributed {
                rank,
                reason: format!(
                    "could not join the {} group of {} through the store at {}:{}: {}",
                    backend.name(),
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

    /// The group's collectives.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Where the tensors of the group's collectives live: the CPU for Gloo, this rank's
    /// GPU for NCCL.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// Replaces `tensor` (contiguous, on [`ProcessGroup::device`]) on every rank by its
    /// sum over the ranks.
    pub fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
        self.all_reduce(tensor, false)
    }

    /// Replaces `tensor` (contiguous, on [`ProcessGroup::device`]) on every rank by its
    /// elementwise maximum over the ranks.
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

    /// Gloo takes contiguous CPU tensors, NCCL tensors of its GPU; lethe reduces flat
    /// buffers, so anything else is a bug in the caller, reported as an error rather
    /// than a crash in C++.
    fn check(&self, tensor: &Tensor, what: &str) -> Result<()> {
        if tensor.device() != self.device() || !tensor.is_contiguous() {
            return Err(LetheError::Distributed {
                rank: self.rank,
                reason: format!(
                    "{what} over {} needs a contiguous tensor on {}, got one on {}",
                    self.backend.name(),
                    crate::device::name(self.device()),
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
        // The reducer's hooks go before the group shuts down.
        drop(self.reducer.take());
        // SAFETY: `raw` came from `lethe_dist_init` and is freed once.
        unsafe { lethe_dist_free(self.raw.as_ptr()) }
    }
}

/// The bytes of the Reducer's first bucket (DDP's `first_bucket_bytes_cap`): small, so
/// that communication starts early in the backward pass.
pub const FIRST_BUCKET_BYTES: i64 = 1 << 20;

/// The bytes of the Reducer's other buckets (DDP's `bucket_cap_mb`, 25 MiB).
pub const REDUCER_BUCKET_BYTES: i64 = 25 << 20;

/// c10d's Reducer, the engine of PyTorch's DistributedDataParallel, over a group's
/// trainable parameters: hooks on their gradients' accumulation sum buckets of them over
/// the ranks while the backward pass is still computing the rest (the first bucket
/// [`FIRST_BUCKET_BYTES`], the others [`REDUCER_BUCKET_BYTES`], filled in the reverse of
/// the parameters' order, the order their gradients come in), and copy the sums back when
/// it ends. A parameter without a gradient on one rank counts as zeros there.
pub struct Reducer {
    raw: NonNull<lethe_kernels::RawReducer>,
    rank: usize,
    /// Prepared for the current step's backward pass, its sums not yet taken.
    prepared: std::cell::Cell<bool>,
    /// The parameters the hooks are on, kept alive as long as they are.
    _params: Vec<Tensor>,
}

// As the group: driven from one thread at a time.
unsafe impl Send for Reducer {}

impl ProcessGroup {
    /// From now on, sums the gradients of `params` (every rank the same list) during the
    /// backward pass of each step ([`ProcessGroup::prepare_for_backward`]), through a
    /// [`Reducer`], when they live on the group's device; otherwise (Gloo ranks on GPUs)
    /// [`ProcessGroup::sum_gradients`] keeps summing them after it, through host memory.
    /// Returns whether the reduction overlaps the backward pass.
    pub fn overlap_gradients(&mut self, params: &[Tensor]) -> Result<bool> {
        if params.is_empty() || params.iter().any(|p| p.device() != self.device()) {
            return Ok(false);
        }
        self.reducer = Some(self.reducer(params)?);
        Ok(true)
    }

    /// Before the backward pass of `loss` whose gradients are to be summed (the last
    /// micro-batch's), with [`ProcessGroup::overlap_gradients`] on; nothing otherwise.
    pub fn prepare_for_backward(&self, loss: &Tensor) -> Result<()> {
        match &self.reducer {
            Some(r) => r.prepare(loss),
            None => Ok(()),
        }
    }

    /// A [`Reducer`] of `params` (on the group's device, every rank the same list).
    fn reducer(&self, params: &[Tensor]) -> Result<Reducer> {
        if let Some(p) = params.iter().find(|p| p.device() != self.device()) {
            return Err(LetheError::Distributed {
                rank: self.rank,
                reason: format!(
                    "the overlapped all-reduce needs the parameters on {}, and one is on {}",
                    crate::device::name(self.device()),
                    crate::device::name(p.device())
                ),
            });
        }
        let params: Vec<Tensor> = params.iter().map(Tensor::shallow_clone).collect();
        let raws: Vec<lethe_kernels::RawTensor> = params.iter().map(lethe_kernels::raw).collect();
        let mut error = std::ptr::null_mut();
        // SAFETY: every pointer is a live at::Tensor for the call (the C++ side copies the
        // tensors, sharing their storage); `error` receives a message or stays null.
        let raw = unsafe {
            lethe_kernels::lethe_dist_reducer_new(
                self.raw.as_ptr(),
                raws.as_ptr(),
                raws.len() as c_int,
                FIRST_BUCKET_BYTES,
                REDUCER_BUCKET_BYTES,
                &mut error,
            )
        };
        match NonNull::new(raw) {
            Some(raw) => Ok(Reducer { raw, rank: self.rank, prepared: false.into(), _params: params }),
            // SAFETY: the message `lethe_dist_reducer_new` wrote, taken once.
            None => Err(LetheError::Distributed {
                rank: self.rank,
                reason: format!("building the gradients' reducer: {}", unsafe { lethe_kernels::take_error(error) }),
            }),
        }
    }
}

impl Reducer {
    /// Before the backward pass of `loss` whose gradients are to be summed over the
    /// ranks (the last micro-batch's): that backward pass all-reduces as it goes.
    pub fn prepare(&self, loss: &Tensor) -> Result<()> {
        let ptr = lethe_kernels::raw(loss);
        // SAFETY: `ptr` is a live at::Tensor for the call.
        lethe_kernels::status(|error| unsafe {
            lethe_kernels::lethe_dist_reducer_prepare(self.raw.as_ptr(), ptr, error)
        })
        .map_err(|message| LetheError::Distributed {
            rank: self.rank,
            reason: format!("preparing the gradients' all-reduce: {message}"),
        })?;
        self.prepared.set(true);
        Ok(())
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `lethe_dist_reducer_new` and is freed once.
        unsafe { lethe_kernels::lethe_dist_reducer_free(self.raw.as_ptr()) }
    }
}

/// Floats per all-reduce when gradients are reduced in buckets (16 MiB of f32): few
/// calls, each large enough to keep the links busy, none holding a second copy of a
/// large model at once.
pub const BUCKET_ELEMENTS: i64 = 4 << 20;

impl ProcessGroup {
    /// Sums `values` over the ranks (in f64) and returns the sums.
    pub fn sum_f64(&self, values: &[f64]) -> Result<Vec<f64>> {
        let mut t = Tensor::from_slice(values).to_device(self.device());
        self.all_reduce_sum(&mut t)?;
        Vec::<f64>::try_from(&t.to_device(Device::Cpu))
            .map_err(|e| LetheError::Distributed { rank: self.rank, reason: format!("reading a reduced value: {e}") })
    }

    /// The elementwise maximum of `values` over the ranks.
    pub fn max_f64(&self, values: &[f64]) -> Result<Vec<f64>> {
        let mut t = Tensor::from_slice(values).to_device(self.device());
        self.all_reduce_max(&mut t)?;
        Vec::<f64>::try_from(&t.to_device(Device::Cpu))
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
    /// With a [`Reducer`] prepared for this step's backward pass, the gradients were summed
    /// during it: only the figures are.
    pub fn sum_gradients(&self, params: &[(String, Tensor)], figures: &[f64]) -> Result<Vec<f64>> {
        if self.reducer.as_ref().is_some_and(|r| r.prepared.replace(false)) {
            return self.sum_f64(figures);
        }
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

    /// Runs `collective` on each bucket of `tensors` flattened into one tensor on the
    /// group's device, then copies the result back into the tensors, in place.
    fn through_buckets(&self, tensors: &[Tensor], collective: impl Fn(&mut Tensor) -> Result<()>) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for bucket in buckets(tensors) {
            let flat: Vec<Tensor> = bucket.iter().map(|t| t.reshape([-1]).to_device(self.device())).collect();
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
        let mut t = Tensor::from_slice(&all).to_device(self.device());
        self.all_reduce_sum(&mut t)?;
        let all = Vec::<u8>::try_from(&t.to_device(Device::Cpu))
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

/// The device and the data-parallel group of a training (or bench) under torchrun;
/// `device` and `None` for a single process. Every rank of a launch joins, one alone
/// too (`torchrun --nproc-per-node 1`). A GPU rank takes `cuda:LOCAL_RANK` for NCCL, or
/// `cuda:(LOCAL_RANK mod GPUs)` for Gloo ([`rank_backend`]). The batch must split evenly
/// into every rank's micro-batches (`train.batch` a multiple of ranks x `train.accum`).
pub fn join_for_training(cfg: &crate::config::Config, device: Device) -> Result<(Device, Option<ProcessGroup>)> {
    let Some(launch) = Launch::from_env()? else { return Ok((device, None)) };
    let gpus = if device.is_cuda() { tch::Cuda::device_count().max(0) as usize } else { 0 };
    let (device, backend) = rank_backend(device, cfg.train.dist_backend, launch.local_rank, gpus)
        .map_err(|reason| LetheError::Distributed { rank: launch.rank, reason })?;
    let parts = launch.world_size * cfg.train.accum;
    if !cfg.train.batch.is_multiple_of(parts) {
        let reason = format!(
            "must split into {} ranks x {} micro-batches (train.accum): a multiple of {parts}",
            launch.world_size, cfg.train.accum
        );
        return Err(LetheError::config("train.batch", cfg.train.batch, reason));
    }
    let group = ProcessGroup::join(&launch, Duration::from_secs(cfg.train.dist_timeout), backend)?;
    Ok((device, Some(group)))
}

/// The device and the collectives of local rank `local_rank` whose `train.device` is
/// `device`, on a machine with `gpus` GPUs, as `train.dist_backend` asks: CPU ranks use
/// Gloo; GPU ranks NCCL on `cuda:LOCAL_RANK` (one GPU a rank), or with `gloo` share the
/// GPUs in turn. The error says what to change.
pub fn rank_backend(
    device: Device,
    asked: DistBackend,
    local_rank: usize,
    gpus: usize,
) -> std::result::Result<(Device, Backend), String> {
    match (device, asked) {
        (Device::Cpu, DistBackend::Nccl) => {
            Err("train.dist_backend = \"nccl\" needs GPU ranks, and train.device is cpu: set --device cuda, or train.dist_backend = \"gloo\"".into())
        }
        (Device::Cpu, _) => Ok((Device::Cpu, Backend::Gloo)),
        (Device::Cuda(_), _) if gpus == 0 => Err("train.device asks for a GPU and this machine shows none".into()),
        (Device::Cuda(_), DistBackend::Gloo) => Ok((Device::Cuda(local_rank % gpus), Backend::Gloo)),
        (Device::Cuda(_), _) if local_rank < gpus => {
            Ok((Device::Cuda(local_rank), Backend::Nccl { device: local_rank }))
        }
        (Device::Cuda(_), _) => Err(format!(
            "NCCL takes one GPU a rank, and LOCAL_RANK={local_rank} has none of this machine's {gpus}: start at most {gpus} ranks a machine, or set train.dist_backend = \"gloo\" to let ranks share GPUs"
        )),
        (other, _) => Err(format!("data-parallel training runs on the CPU or GPUs, not {}", crate::device::name(other))),
    }
}

/// Loads [`NCCL_LIBRARY`] (once a process): from `LETHE_NCCL` if it is set, else from
/// beside the running executable. The error says how to build it, or to use Gloo.
pub fn load_nccl() -> std::result::Result<std::path::PathBuf, String> {
    static LOADED: std::sync::OnceLock<std::result::Result<std::path::PathBuf, String>> = std::sync::OnceLock::new();
    LOADED.get_or_init(load_nccl_once).clone()
}

fn load_nccl_once() -> std::result::Result<std::path::PathBuf, String> {
    // The library links libtorch's CUDA backend, which lethe loads only when asked.
    crate::device::load_cuda_backend();
    let named = std::env::var_os(NCCL_LIBRARY_VAR).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join(NCCL_LIBRARY)));
    let path = match (named, beside) {
        (Some(path), _) if !path.is_file() => return Err(format!("{NCCL_LIBRARY_VAR}: no file {}", path.display())),
        (Some(path), _) => path,
        (None, Some(path)) if path.is_file() => path,
        _ => {
            return Err(format!(
                "NCCL needs {NCCL_LIBRARY} beside lethe or in {NCCL_LIBRARY_VAR} (scripts/build-nccl.sh builds it); or use Gloo (train.dist_backend = \"gloo\", dist-check --backend gloo)"
            ))
        }
    };
    let c = CString::new(path.to_string_lossy().as_bytes())
        .map_err(|_| format!("{NCCL_LIBRARY_VAR}: {} holds a NUL byte", path.display()))?;
    // SAFETY: a valid NUL-terminated path; the library stays loaded for the process.
    lethe_kernels::status(|error| unsafe { lethe_dist_nccl_load(c.as_ptr(), error) })
        .map_err(|message| format!("loading NCCL's library: {message}"))?;
    Ok(path)
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
        let mut t = Tensor::full([elements as i64], group.rank() as f64 + 1.0, (tch::Kind::Float, group.device()));
        let start = std::time::Instant::now();
        group.all_reduce_sum(&mut t)?;
        times.push(start.elapsed().as_secs_f64());
        expect_all(group, &t, n * (n + 1.0) / 2.0, "all-reduce")?;
    }
    let mut t = Tensor::full([elements as i64], group.rank() as f64 + 10.0, (tch::Kind::Float, group.device()));
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

    #[test]
    fn an_unknown_master_addr_is_refused_before_the_rendezvous() {
        let launch = |host: &str| {
            let env = [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", host), ("MASTER_PORT", "29500")];
            Launch::from_vars(vars(&env)).unwrap().unwrap()
        };
        for host in ["127.0.0.1", "localhost", "::1"] {
            launch(host).check_host().unwrap();
        }
        // `.invalid` is reserved never to resolve (RFC 6761).
        let msg = launch("no-such-host.invalid").check_host().unwrap_err().to_string();
        assert!(msg.contains("MASTER_ADDR=\"no-such-host.invalid\" is not a host"), "{msg}");
    }

    #[test]
    fn gpu_ranks_take_nccl_on_their_local_gpu_and_cpu_ranks_gloo() {
        use DistBackend::{Auto, Gloo, Nccl};
        let cases = [
            (Device::Cpu, Auto, 3, 0, (Device::Cpu, Backend::Gloo)),
            (Device::Cpu, Gloo, 1, 0, (Device::Cpu, Backend::Gloo)),
            (Device::Cuda(0), Auto, 1, 2, (Device::Cuda(1), Backend::Nccl { device: 1 })),
            (Device::Cuda(0), Nccl, 0, 1, (Device::Cuda(0), Backend::Nccl { device: 0 })),
            // Gloo lets ranks share GPUs, in turn.
            (Device::Cuda(0), Gloo, 1, 1, (Device::Cuda(0), Backend::Gloo)),
            (Device::Cuda(0), Gloo, 3, 2, (Device::Cuda(1), Backend::Gloo)),
        ];
        for (device, asked, local, gpus, expected) in cases {
            assert_eq!(
                rank_backend(device, asked, local, gpus).unwrap(),
                expected,
                "{device:?} {asked:?} {local} {gpus}"
            );
        }
    }

    #[test]
    fn a_rank_nccl_cannot_serve_says_what_to_change() {
        let cases = [
            (Device::Cpu, DistBackend::Nccl, 0, 0, "needs GPU ranks"),
            (Device::Cuda(0), DistBackend::Auto, 1, 1, "LOCAL_RANK=1 has none of this machine's 1"),
            (Device::Cuda(0), DistBackend::Nccl, 0, 0, "shows none"),
        ];
        for (device, asked, local, gpus, needle) in cases {
            let e = rank_backend(device, asked, local, gpus).unwrap_err();
            assert!(e.contains(needle) && (gpus == 0 && device.is_cuda() || e.contains("gloo")), "{e}");
        }
    }
}
