//! Expire-Span's attention of a block, by one of three paths that compute the same
//! function (Eq. 4-7, paper 4.1-4.2) and that the tests hold equal: the written-out tensor
//! operations (the reference), the CPU's fused kernel in causal chunks of queries, and on
//! a GPU one bias node (its CUDA kernels) before libtorch's fused attention.

use super::*;

impl ExpireSpan {
    /// The attention of Eq. 4, the soft mask `mask` `(b, m, n)` applied after the softmax
    /// with renormalisation, as one attention with an additive bias: `ln m` and the
    /// relative positions (see [`attention::attend`]). `q` `(b, h, m, dh)`, `k` and `v`
    /// `(b, h, n, dh)`, `dist` `(b, m, n)`, `mask` and `visible` `(b, m, n)` or per
    /// key-value head `(b, g, m, n)` (`visible` false wherever `m = 0`); returns `(b, h, m, dh)`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn context(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_pe: Option<&Tensor>,
        dist: &Tensor,
        mask: &Tensor,
        visible: &Tensor,
        dropout: f64,
        train: bool,
    ) -> Tensor {
        let scoring = profile::phase("bias");
        let scaled = q / (q.size()[3] as f64).sqrt();
        let log_mask = log_mask_of_heads(&attention::log_mask_of_visible(mask, visible), q.size()[1]);
        let bias = self.bias(&scaled, key_pe, dist, &log_mask); // (b, h, m, n)
        drop(scoring);
        let _mixing = profile::phase("attention");
        attention::attend(q, k, v, &bias, dropout, train)
    }

    /// The attention bias `(b, h, m, n)`: the relative-position scores for distances below
    /// `pos_rows` (zero beyond) plus `log_mask` `(b, 1, m, n)`; `log_mask` itself without
    /// position embeddings (a Llama-family layer, its queries and keys rotated). `q` `(b, h, m, dh)` is
    /// scaled already, `dist` `(b, m, n)`. Only the last `pos_rows - 1 + m` keys can be that
    /// close (the cache is ordered by time), so only they are gathered. (Laying out the
    /// block's own keys, at regular distances, by the skew of window attention instead
    /// was tried: at L = 512 the three-part concatenation cost more than the gather it
    /// saved, 15.7 against 20.4 ms per step in the bias and 154 against 170 ms in the
    /// backward pass, `lethe bench --profile`.)
    pub(super) fn bias(&self, q: &Tensor, key_pe: Option<&Tensor>, dist: &Tensor, log_mask: &Tensor) -> Tensor {
        let Some(key_pe) = key_pe else { return log_mask.shallow_clone() };
        let (b, h, m, _) = q.size4().expect("queries must be (b, h, m, dh)");
        let (n, rows) = (dist.size()[2], self.pos_rows);
        let width = n.min(rows - 1 + m);
        let near = dist.narrow(2, n - width, width); // (b, m, w)

        // Distances out of range read an extra row of zeros at index `rows` (a later key,
        // at a negative distance, is masked by `log_mask` anyway).
        let in_range = near.ge(0.0).logical_and(&near.lt(rows as f64));
        let index = near.to_kind(Kind::Int64).where_scalarother(&in_range, rows); // (b, m, w)
        let zero_row = key_pe.zeros_like().narrow(0, 0, 1);
        let by_distance = q.matmul(&Tensor::cat(&[key_pe, &zero_row], 0).tr()); // (b, h, m, P + 1)
        let mut near_bias = by_distance.gather(-1, &index.unsqueeze(1).expand([b, h, m, width], false), false); // (b, h, m, w)

        // In place: the gather's backward pass needs only its index.
        near_bias += log_mask.narrow(3, n - width, width);
        if width == n {
            return near_bias;
        }
        Tensor::cat(&[&log_mask.narrow(3, 0, n - width).expand([b, h, m, n - width], false), &near_bias], 3)
    }

    /// The attention of a block as the written-out tensor operations (the reference,
    /// and the GPU's path): the soft mask, its log and the positions as a bias, the
    /// span loss from the pairs on the ramp. Returns the context `(b, h, m, dh)`, the
    /// span loss in training, and the pairs seen (by any head).
    pub(super) fn attend_written_out(&self, p: &Operands, input: &AttendInput) -> (Tensor, Option<Tensor>, Seen) {
        let m = input.x.size()[1];
        let masking = profile::phase("mask");
        let (remaining, dist) = remaining(p.spans, p.counter, m); // (b, [g,] m, n), (b, m, n)
        let mask = soft_mask(&remaining, self.cfg.ramp as f64).to_kind(p.spans.kind()); // (b, [g,] m, n)
        let visible = visible_pairs(p.usable, &dist, &mask); // (b, [g,] m, n)
        drop(masking);
        let context = self.context(p.q, p.k, p.v, p.key_pe, &dist, &mask, &visible, input.attn.dropout, input.train); // (b, h, m, dh)
        let _loss = profile::phase("span loss");
        let aux = self
            .span_loss_applies(input.train)
            .then(|| ramp_loss(p.spans, &dist, &on_ramp(&mask, &visible), self.cfg.ramp as f64, m, self.cfg.alpha));
        let seen = match visible.dim() {
            4 => visible.any_dim(1, false),
            _ => visible,
        };
        (context, aux, Seen::Pairs(seen))
    }

    /// [`Self::attend_written_out`] through the fused CPU kernel ([`expire_fused`]): the
    /// mask, its log, the positions' layout, the softmax and the ramp counts in one pass
    /// over the scores, and without attention dropout the whole attention stream by
    /// stream over each stream's own keys, the left padding of the compacted cache left
    /// out ([`expire_fused::expire_attend`]).
    ///
    /// The queries go in chunks of [`QUERY_CHUNK`], each over the keys up to its last
    /// query: the block's later keys are masked for every query of a chunk (a query sees
    /// no key after itself), so they are left out of its products, kernel and softmax.
    pub(super) fn attend_fused(&self, p: &Operands, input: &AttendInput) -> Result<(Tensor, Option<Tensor>, Seen)> {
        let (m, n) = (input.x.size()[1], p.k.size()[2]);
        let scaled = p.q / (p.q.size()[3] as f64).sqrt();
        let counter = p.counter.to_kind(p.q.kind());
        let (mut contexts, mut losses) = (Vec::new(), Vec::new());
        let chunks = causal_chunks(n - m, m, QUERY_CHUNK);
        // Each chunk's views, one backward pass for all chunks' queries, keys and values
        // each. The span loss is linear in the ramp counts: the block's is the sum of its
        // chunks', each over the chunk's keys' spans.
        let views = chunk_queries(&scaled, &chunks)?
            .into_iter()
            .zip(chunk_keys(p.k, &chunks)?)
            .zip(chunk_keys(p.v, &chunks)?)
            .zip(&chunks)
            .map(|(((q, k), v), c)| ChunkViews { q, k, v, spans: attention::part(p.spans, 1, 0, c.keys) });
        for (c, views) in chunks.iter().zip(views) {
            let (context, loss) = self.fused_chunk(p, &views, &counter, c, input)?;
            contexts.push(context);
            losses.extend(loss);
        }
        let context = cat_chunks(contexts); // (b, h, m, dh)
        let aux = losses.into_iter().reduce(|a, b| a + b);
        Ok((
            context,
            aux,
            Seen::Spans { spans: p.spans.detach(), usable: p.usable.shallow_clone(), ramp: self.cfg.ramp as f64 },
        ))
    }

    /// One chunk of [`Self::attend_fused`]: its context `(b, h, queries, dh)` and, in
    /// training, its part of the span loss (the sum over its ramp pairs). `views` are the
    /// chunk's queries divided by `sqrt(dh)`, keys, values and spans, `counter` the keys'
    /// distances to the block's first query.
    pub(super) fn fused_chunk(
        &self,
        p: &Operands,
        views: &ChunkViews,
        counter: &Tensor,
        c: &Chunk,
        input: &AttendInput,
    ) -> Result<(Tensor, Option<Tensor>)> {
        // Distances to the chunk's first query; the usable keys of its rows.
        let chunk_counter = match c.q0 {
            0 => attention::part(counter, 1, 0, c.keys),
            q0 => attention::part(counter, 1, 0, c.keys) + q0 as f64,
        }; // (b, keys)
        let usable = match p.usable.size()[1] {
            1 => attention::part(p.usable, 2, 0, c.keys), // (b, 1, keys)
            _ => c.of(p.usable),                          // (b, queries, keys)
        };
        let (q, ramp, m) = (&views.q, self.cfg.ramp as f64, input.x.size()[1]); // (b, h, queries, dh)

        // The span loss's `alpha / (R M)`, M the block's length.
        let loss_scale = if self.span_loss_applies(input.train) { self.cfg.alpha / ramp / m as f64 } else { 0.0 };
        if self.ragged(input) {
            let positioning = profile::phase("positions");
            let positions = q.matmul(&positions_of(p)?.tr()); // (b, h, queries, P)
            drop(positioning);
            let _attending = profile::phase("attention");
            let fused = expire_fused::expire_attend(
                q,
                &views.k,
                &views.v,
                &positions,
                &views.spans,
                &chunk_counter,
                &usable,
                ramp,
                loss_scale,
            )?;
            return Ok((fused.context, (loss_scale > 0.0).then_some(fused.span_loss)));
        }
        // With dropout on the weights: the kernel's weights, dropped, times the values.
        let scoring = profile::phase("scores");
        let products = profile::phase("products");
        let content = q.matmul(&views.k.transpose(-2, -1)); // (b, h, queries, keys)
        let positions = q.matmul(&positions_of(p)?.tr()); // (b, h, queries, P)
        drop(products);
        let _kernel = profile::phase("fused kernel");
        let fused = expire_fused::expire_weights(&content, &positions, &views.spans, &chunk_counter, &usable, ramp)?;
        drop((_kernel, scoring));
        let mixing = profile::phase("attention");
        let context = attention::weigh(&fused.out, &views.v, input.attn.dropout, input.train);
        drop(mixing);
        let _loss = profile::phase("span loss");
        let loss = (loss_scale > 0.0).then(|| {
            ramp_loss_of_counts(&views.spans, &fused.ramp_counts, &fused.ramp_distance, ramp, m, self.cfg.alpha)
        });
        Ok((context, loss))
    }

    /// [`Self::attend_written_out`] with the mask's log, the positions and the span loss
    /// from one autograd node ([`expire_bias`]: four CUDA kernels on a GPU), then
    /// libtorch's fused attention over the whole block with that bias.
    pub(super) fn attend_biased(&self, p: &Operands, input: &AttendInput) -> Result<(Tensor, Option<Tensor>, Seen)> {
        let (m, ramp) = (input.x.size()[1], self.cfg.ramp as f64);
        let scoring = profile::phase("bias");
        let scaled = p.q / (p.q.size()[3] as f64).sqrt();
        let positions = scaled.matmul(&positions_of(p)?.tr()); // (b, h, m, P)
        let counter = p.counter.to_kind(p.q.kind());
        // The span loss's `alpha / (R M)`, M the block's length.
        let loss = self.span_loss_applies(input.train).then(|| self.cfg.alpha / ramp / m as f64);
        let bias = expire_bias::expire_bias(&positions, p.spans, &counter, p.usable, ramp, loss)?; // (b, h, m, n)
        drop(scoring);
        let _mixing = profile::phase("attention");
        let context = attention::attend(p.q, p.k, p.v, &bias.bias, input.attn.dropout, input.train);
        Ok((context, bias.loss, Seen::Spans { spans: p.spans.detach(), usable: p.usable.shallow_clone(), ramp }))
    }

    /// Which path computes a block's attention: with `memory.expire.fused`, the fused
    /// kernel on the CPU and the bias kernels on a GPU (when `liblethe_cuda.so` is
    /// loaded); otherwise, or without them, the written-out operations.
    pub(super) fn path(&self, input: &AttendInput) -> Result<Path> {
        let device = input.q.device();
        if self.fused(input) {
            return Ok(Path::Fused);
        }
        let float = matches!(input.q.kind(), Kind::Float | Kind::Double);
        let bias = self.cfg.fused
            && self.span_heads == 1
            && float
            && (device.is_cuda() || self.bias_on_cpu)
            && input.key_pe.is_some();
        Ok(if bias && expire_bias::runs_on(device)? { Path::Biased } else { Path::WrittenOut })
    }

    /// Whether the fused CPU kernel computes the attention ([`Self::attend_fused`]): it
    /// lays out learned relative positions, so not on a Llama-family layer.
    pub(super) fn fused(&self, input: &AttendInput) -> bool {
        self.cfg.fused
            && self.span_heads == 1
            && !self.bias_on_cpu
            && input.key_pe.is_some()
            && expire_fused::supports(input.q)
    }

    /// Whether the whole attention goes stream by stream ([`expire_fused::expire_attend`]):
    /// the fused kernel without dropout on the weights.
    pub(super) fn ragged(&self, input: &AttendInput) -> bool {
        self.fused(input) && (input.attn.dropout == 0.0 || !input.train)
    }
}

/// The log of the soft mask for each of `heads` query heads: `(b, 1, m, n)` of one mask
/// `(b, m, n)` shared by the heads, or `(b, heads, m, n)` of one per key-value head
/// `(b, g, m, n)`, each repeated for the `heads / g` query heads of its group (as
/// [`attention`] repeats the group's keys).
fn log_mask_of_heads(log_mask: &Tensor, heads: i64) -> Tensor {
    let Ok((b, g, m, n)) = log_mask.size4() else { return log_mask.unsqueeze(1) };
    log_mask.unsqueeze(2).expand([b, g, heads / g, m, n], false).reshape([b, heads, m, n])
}

/// The position embeddings the fused and bias paths lay out (chosen only when there are).
fn positions_of<'a>(p: &Operands<'a>) -> Result<&'a Tensor> {
    p.key_pe.ok_or_else(|| {
        LetheError::Invalid("Expire-Span's fused paths need relative positions (model.arch = \"lethe\")".into())
    })
}
