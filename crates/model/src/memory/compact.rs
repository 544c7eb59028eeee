//! The per-stream compaction of Expire-Span's cache (paper 4.1, physical deletion):
//! after a block, every stream keeps its live memories, in order, right-aligned and
//! padded on the left to the stream that keeps the most.
//!
//! On the CPU one call into `csrc/compact.cpp` plans the slots and copies them; on
//! other devices (and as the reference the tests compare with) it is libtorch
//! operations: a stable sort of the flags and a gather. The two give the same tensors,
//! padding included: a stream's padding slots hold its last dropped memories.
//!
//! On a GPU with lethe's kernels, [`forget`] does Expire-Span's whole deletion in one call
//! (`csrc/expire_forget.cpp`): the keep decision, the compaction and the next block's
//! counters and validity, two kernels and one number read back, the same tensors as the flags and the
//! libtorch compaction give.

use std::ffi::c_void;

use tch::{Kind, Tensor};

use lethe_core::error::{LetheError, Result};
use lethe_kernels::{lethe_compact, lethe_expire_forget, raw};

/// A compacted cache: which new slots hold a memory `(b, c)`, and each tensor at them.
pub struct Compacted {
    /// `(b, c)` bool: false on a stream's padding, on the left.
    pub valid: Tensor,
    /// The tensors given, `(b, n, ..)` each, now `(b, c, ..)`, in the same order (on the
    /// CPU, the first `c` slots of `with_room`'s tensors).
    pub tensors: Vec<Tensor>,
    /// On the CPU, each tensor `(b, c + room, ..)`: the compacted slots, then `room` free
    /// ones (unwritten) where the next block can be written without a concatenation.
    /// Empty on other devices.
    pub with_room: Vec<Tensor>,
}

/// Keeps, in every stream, the slots of `tensors` `(b, n, ..)` (no gradient) where `keep`
/// `(b, n)` is true, in order, right-aligned and padded on the left to the longest
/// stream; on the CPU with `room` free slots after them ([`Compacted::with_room`]).
pub fn compact(keep: &Tensor, tensors: &[&Tensor], room: i64) -> Result<Compacted> {
    if keep.device() == tch::Device::Cpu && tensors.iter().all(|t| t.device() == tch::Device::Cpu) {
        return compact_on_cpu(keep, tensors, room);
    }
    let (index, valid) = compact_per_stream(keep);
    Ok(Compacted { valid, tensors: tensors.iter().map(|t| gather_slots(t, &index)).collect(), with_room: vec![] })
}

fn compact_on_cpu(keep: &Tensor, tensors: &[&Tensor], room: i64) -> Result<Compacted> {
    let mut inputs: Vec<*mut c_void> = tensors.iter().map(|t| raw(t)).collect();
    let mut out: Vec<*mut c_void> = vec![std::ptr::null_mut(); tensors.len() + 1];
    // SAFETY: every pointer is a live `at::Tensor*` owned by its `Tensor` for the call (the
    // kernel reads them only); on success it writes `count + 1` new `at::Tensor*`.
    lethe_kernels::call("expire-span cache compaction", |error| unsafe {
        lethe_compact(raw(keep), inputs.as_mut_ptr(), tensors.len() as i64, room, out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each pointer is taken over once.
    let mut taken = out.into_iter().map(|p| unsafe { lethe_kernels::tensor(p) });
    let valid = taken.next().ok_or_else(|| LetheError::Invalid("expire-span cache compaction: no validity".into()))?;
    let with_room: Vec<Tensor> = taken.collect();
    let c = valid.size()[1];
    Ok(Compacted { valid, tensors: with_room.iter().map(|t| t.narrow(1, 0, c)).collect(), with_room })
}

/// Expire-Span's cache after [`forget`]: the kept states, and their counters and validity
/// with the next block's after them.
pub struct Forgotten {
    /// `(b, c, d)`: the kept states (no room after them: the cache is held between
    /// steps, one per micro-batch, and the room would be held with it).
    pub states: Tensor,
    /// `(b, c + m)`: the kept memories' distances to the next block's first query, then
    /// the next block's own, `0, -1, .., -(m - 1)`.
    pub counter: Tensor,
    /// `(b, c + m)`: false on a stream's padding, true on the room.
    pub valid: Tensor,
}

/// Expire-Span's deletion after a block of `m` (paper 4.1): of `[cache, block]`'s states
/// `(b, n, d)` (no gradient), spans, counters and validity `(b, n)`, every stream keeps
/// the memories the next block's first query sees, `valid` and `spans + ramp - (counter +
/// m) > 0`, compacted as [`compact`] does, the next block's counters and validity after
/// theirs. On a GPU the
/// kernels of `liblethe_cuda.so` (which must be loaded); on the CPU their arithmetic in
/// loops.
pub fn forget(
    states: &Tensor,
    spans: &Tensor,
    counter: &Tensor,
    valid: &Tensor,
    ramp: f64,
    m: i64,
) -> Result<Forgotten> {
    let mut out: [*mut c_void; 3] = [std::ptr::null_mut(); 3];
    // SAFETY: each pointer is a live `at::Tensor*` owned by its `Tensor` for the call (the
    // kernel reads them only); on success it writes three new `at::Tensor*`.
    lethe_kernels::call("expire-span deletion", |error| unsafe {
        lethe_expire_forget(raw(states), raw(spans), raw(counter), raw(valid), ramp, m, out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each pointer is taken over once.
    let [states, counter, valid] = out.map(|p| unsafe { lethe_kernels::tensor(p) });
    Ok(Forgotten { states, counter, valid })
}

/// The libtorch-operation compaction: the gather index `(b, c)` and the validity `(b, c)`.
pub fn compact_per_stream(keep: &Tensor) -> (Tensor, Tensor) {
    let n = keep.size()[1];
    // A stable sort of the flags puts a stream's dropped slots first and its kept ones
    // after them, each in order; the sorted flags are then the new slots' validity.
    let (sorted, order) = keep.sort_stable(true, 1, false); // (b, n) each
    let c = keep.sum_dim_intlist([1i64].as_slice(), false, Kind::Int64).max().int64_value(&[]);
    (order.narrow(1, n - c, c), sorted.narrow(1, n - c, c))
}

/// `t` `(b, n, ..)` at `index` `(b, c)` along dimension 1: `(b, c, ..)`, whole slots
/// copied (libtorch's gather copies element by element).
pub fn gather_slots(t: &Tensor, index: &Tensor) -> Tensor {
    let size = t.size();
    let (b, n, c) = (size[0], size[1], index.size()[1]);
    let slot: i64 = size[2..].iter().product();
    let first = Tensor::arange(b, (Kind::Int64, index.device())).unsqueeze(1) * n; // (b, 1)
    let rows = (index + first).view([b * c]);
    let mut out_size = size.clone();
    out_size[1] = c;
    t.contiguous().view([b * n, slot]).index_select(0, &rows).view(out_size.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::rng::Rng;

    #[test]
    fn per_stream_compaction_keeps_live_slots_in_order_right_aligned() {
        let keep = Tensor::from_slice(&[true, false, true, true, false, false, false, true]).view([2, 4]);
        let (index, valid) = compact_per_stream(&keep);
        // Stream 0 keeps 0, 2, 3; stream 1 keeps 3 and is padded to 3 slots.
        let idx: Vec<i64> = index.flatten(0, -1).try_into().unwrap();
        let v: Vec<bool> = valid.flatten(0, -1).try_into().unwrap();
        assert_eq!(&idx[..3], &[0, 2, 3]);
        assert_eq!(idx[5], 3);
        assert_eq!(v, vec![true, true, true, false, false, true]);
    }

    /// The slot copy picks what libtorch's gather along dimension 1 picks.
    #[test]
    fn gather_slots_equals_the_gather_along_the_keys() {
        let mut rng = Rng::new(9);
        let (b, n, d, c) = (3, 7, 5, 4);
        let states = rng.normal_tensor(&[b, n, d], Kind::Float);
        let index = (rng.uniform_tensor(&[b, c], Kind::Double) * n as f64).floor().to_kind(Kind::Int64);
        let along_the_keys = |index: &Tensor| states.gather(1, &index.unsqueeze(-1).expand([b, c, d], false), false);
        for index in [index.shallow_clone(), index.flip([0])] {
            assert!(gather_slots(&states, &index).equal(&along_the_keys(&index)));
        }
    }

    /// The kernel gives the libtorch path's tensors exactly, padding included, for
    /// states, counters and episodes, on flags with every stream kept, none kept, and
    /// in between.
    #[test]
    fn the_kernel_compacts_as_the_sort_and_gather_do() {
        let mut rng = Rng::new(17);
        let (b, n, d) = (4, 11, 3);
        let states = rng.normal_tensor(&[b, n, d], Kind::Float);
        let counter = rng.normal_tensor(&[b, n], Kind::Float);
        let episode = (rng.uniform_tensor(&[b, n], Kind::Double) * 5.0).floor().to_kind(Kind::Int64);
        for p in [0.0, 0.3, 0.7, 1.0] {
            let mut keep = rng.uniform_tensor(&[b, n], Kind::Double).lt(p);
            if p == 0.3 {
                // One stream keeps everything, another nothing.
                keep =
                    keep.index_fill(0, &Tensor::from_slice(&[1i64]), 1).index_fill(0, &Tensor::from_slice(&[2i64]), 0);
            }
            let (index, valid) = compact_per_stream(&keep);
            // With room after the kept slots, the same slots first.
            for room in [0, 3] {
                let ours = compact_on_cpu(&keep, &[&states, &counter, &episode], room).unwrap();
                assert!(ours.valid.equal(&valid), "validity at p = {p}");
                assert_eq!((ours.tensors.len(), ours.with_room.len()), (3, 3));
                for ((got, whole), t) in ours.tensors.iter().zip(&ours.with_room).zip([&states, &counter, &episode]) {
                    assert_eq!(got.kind(), t.kind());
                    assert!(got.equal(&gather_slots(t, &index)), "p = {p}, room {room}: {got:?}");
                    assert_eq!(whole.size()[1], valid.size()[1] + room);
                    assert!(whole.narrow(1, 0, valid.size()[1]).equal(got));
                }
            }
        }
    }

    /// Random `[cache, block]` operands `(b, n)` with every stream kept, none kept, and
    /// in between (streams 1 and 2), as [`forget`] takes them: states `(b, n, d)`, spans,
    /// integer counters, validity.
    pub(crate) fn forget_operands(seed: u64, b: i64, n: i64, d: i64, kind: Kind) -> [Tensor; 4] {
        let mut rng = Rng::new(seed);
        let states = rng.normal_tensor(&[b, n, d], kind);
        let mut spans = (rng.uniform_tensor(&[b, n], Kind::Double) * n as f64).to_kind(kind);
        spans = spans.index_fill(0, &Tensor::from_slice(&[1i64]), 10.0 * n as f64).index_fill(
            0,
            &Tensor::from_slice(&[2i64]),
            0.0,
        );
        let counter = (Tensor::arange_start_step(n, 0, -1, (Kind::Double, tch::Device::Cpu)) - 3.0)
            .unsqueeze(0)
            .expand([b, n], false)
            .to_kind(kind)
            .contiguous();
        let valid = rng.uniform_tensor(&[b, n], Kind::Double).gt(0.1);
        [states, spans, counter, valid]
    }

    /// The deletion's kernels, their loops on the CPU, keep what the flags and the
    /// libtorch compaction keep, to the bit and to the padding, and write the next block's
    /// counters and validity in the room.
    #[test]
    fn forget_keeps_what_the_flags_and_the_compaction_keep() {
        let (ramp, m) = (4.0, 5);
        for (seed, b, n, kind) in [(3, 4, 9, Kind::Float), (4, 5, 40, Kind::Float), (5, 3, 17, Kind::Double)] {
            let [states, spans, counter, valid] = forget_operands(seed, b, n, 3, kind);
            let next = &counter + m as f64;
            let keep = valid.logical_and(&(&spans + ramp - &next).gt(0.0));
            let (index, kept) = compact_per_stream(&keep);
            let c = kept.size()[1];
            let f = forget(&states, &spans, &counter, &valid, ramp, m).unwrap();
            assert_eq!(f.states.size(), [b, c, 3]);
            assert!(f.states.equal(&gather_slots(&states, &index)), "states, seed {seed}");
            assert!(f.counter.narrow(1, 0, c).equal(&gather_slots(&next, &index)), "counters, seed {seed}");
            assert!(f.valid.narrow(1, 0, c).equal(&kept), "validity, seed {seed}");
            let block = -Tensor::arange(m, (kind, tch::Device::Cpu)).unsqueeze(0).expand([b, m], false);
            assert!(f.counter.narrow(1, c, m).equal(&block), "the room's counters, seed {seed}");
            assert!(f.valid.narrow(1, c, m).all().int64_value(&[]) == 1, "the room's validity, seed {seed}");
        }
        // Nothing kept: only the room.
        let [states, spans, counter, _] = forget_operands(6, 3, 7, 3, Kind::Float);
        let none = Tensor::zeros([3, 7], (Kind::Bool, tch::Device::Cpu));
        let f = forget(&states, &spans, &counter, &none, ramp, m).unwrap();
        assert_eq!((f.states.size(), f.counter.size()), (vec![3, 0, 3], vec![3, m]));
    }

    #[test]
    fn forget_refuses_what_it_cannot_delete() {
        let [states, spans, counter, valid] = forget_operands(7, 3, 6, 3, Kind::Float);
        let err = |r: Result<Forgotten>| r.err().expect("refused").to_string();
        let e = err(forget(&states.narrow(1, 0, 5), &spans, &counter, &valid, 4.0, 2));
        assert!(e.contains("states (b, n, d)"), "{e}");
        let e = err(forget(&states.copy().set_requires_grad(true), &spans, &counter, &valid, 4.0, 2));
        assert!(e.contains("detach"), "{e}");
        let e = err(forget(&states, &spans, &counter.to_kind(Kind::Double), &valid, 4.0, 2));
        assert!(e.contains("one float kind"), "{e}");
        let e = err(forget(&states, &spans, &counter, &valid, 4.0, -1));
        assert!(e.contains("at least 0"), "{e}");
    }

    #[test]
    fn the_kernel_refuses_what_it_cannot_compact() {
        let keep = Tensor::ones([2, 3], (Kind::Bool, tch::Device::Cpu));
        let wrong = Tensor::zeros([2, 4, 1], (Kind::Float, tch::Device::Cpu));
        let err = compact(&keep, &[&wrong], 0).err().expect("a wrong shape is refused").to_string();
        assert!(err.contains("(b, n) = (2, 3)"), "{err}");
        let with_grad = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let err = compact(&keep, &[&with_grad], 0).err().expect("a tensor with gradient is refused").to_string();
        assert!(err.contains("detach"), "{err}");
        let err = compact(&keep.to_kind(Kind::Float), &[], 0).err().expect("flags must be bool").to_string();
        assert!(err.contains("bool"), "{err}");
        let err = compact(&keep, &[&wrong.narrow(1, 0, 3)], -1).err().expect("negative room is refused").to_string();
        assert!(err.contains("at least 0"), "{err}");
    }
}
