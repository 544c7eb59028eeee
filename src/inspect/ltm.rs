//! `lethe inspect ltm`: what an ∞-former's long-term memory holds. A text is streamed
//! through the model (memory carried, no dropout), and per layer this records:
//!
//! - the attention over the LTM's axis `[0, 1]`, as a histogram averaged over every
//!   block that attended it (the ∞-former paper's Figure 7);
//! - the "memory space" of every token (byte or tokenizer id) absorbed into the LTM: the length of the stretch
//!   of `[0, 1]` it occupies at the end of the text (paper Figures 10-11). New tokens
//!   share `(τ, 1]` evenly; at each update the old axis moves by `t -> τ · CDF(t)`, where
//!   `CDF` is the distribution by which the old signal was sampled (uniform without
//!   sticky memories, so everything contracts evenly; the previous block's attention
//!   histogram with them, so attended regions keep more space).
//!
//! Written as `ltm.svg` (and the same picture as `ltm.png`) and `ltm.html`.

use std::fmt::Write as _;
use std::path::Path;

use tch::{Kind, Tensor};

use super::{cells, colour, glyph, lines, stream_text, Text};
use crate::checkpoint::write_atomic;
use crate::config::Mechanism;
use crate::error::{LetheError, Result};
use crate::model::memory::LtmTrace;
use crate::model::Lm;

/// What each layer's LTM did over a text.
#[derive(Clone, Debug)]
pub struct LtmPicture {
    /// The text.
    pub text: Text,
    /// Per layer, the mean attention histogram over `[0, 1]` (D bins, sums to 1).
    pub attention: Vec<Vec<f64>>,
    /// Per layer, the interval `(start, end)` of `[0, 1]` held by each absorbed token at
    /// the end, for the first `spaces[layer].len()` tokens of the text.
    pub spaces: Vec<Vec<(f64, f64)>>,
    /// Whether the model uses sticky memories.
    pub sticky: bool,
    /// The contraction `τ`: at each update the old memory moves into `[0, τ]` and the
    /// new block takes `(τ, 1]`.
    pub tau: f64,
}

/// Streams `text` through `lm` (an ∞-former) in blocks of its training length.
pub fn trace_ltm(lm: &Lm, text: &Text) -> Result<LtmPicture> {
    if lm.config.memory.mechanism != Mechanism::Infinity {
        return Err(LetheError::Invalid(format!(
            "`{}` memory has no continuous long-term memory; `inspect ltm` needs an ∞-former model",
            lm.config.memory.mechanism
        )));
    }
    let layers = lm.config.model.layers;
    let mut sums: Vec<Vec<f64>> = vec![vec![]; layers];
    let mut blocks = vec![0usize; layers];
    let mut spaces: Vec<Vec<(f64, f64)>> = vec![vec![]; layers];
    stream_text(lm, &text.ids, |mem| {
        // A layer has no trace until its LTM has been attended to.
        for (layer, trace) in mem.ltm_traces().into_iter().enumerate() {
            let Some(trace) = trace else { continue };
            move_spaces(&mut spaces[layer], &trace)?;
            let hist = first_row(&trace.attention)?;
            if sums[layer].is_empty() {
                sums[layer] = vec![0.0; hist.len()];
            }
            sums[layer].iter_mut().zip(&hist).for_each(|(s, h)| *s += h);
            blocks[layer] += 1;
        }
        Ok(())
    })?;
    if blocks.iter().all(|&b| b == 0) {
        return Err(LetheError::Invalid(format!(
            "the text ({} tokens) is too short to reach the long-term memory: it must be longer than the short-term memory (memory.span = {}) plus a block ({})",
            text.ids.len(),
            lm.config.memory.span,
            lm.config.train.block
        )));
    }
    let attention =
        sums.into_iter().zip(&blocks).map(|(s, &n)| s.into_iter().map(|v| v / n.max(1) as f64).collect()).collect();
    Ok(LtmPicture {
        text: text.clone(),
        attention,
        spaces,
        sticky: lm.config.memory.infinity.sticky,
        tau: lm.config.memory.infinity.tau,
    })
}

/// The first stream's row of a `(b, D)` histogram.
fn first_row(t: &Tensor) -> Result<Vec<f64>> {
    Vec::<f64>::try_from(t.get(0).to_kind(Kind::Double).to_device(tch::Device::Cpu))
        .map_err(|e| LetheError::Invalid(format!("reading the LTM histogram: {e}")))
}

/// Applies one block's absorption to the tokens' intervals.
fn move_spaces(spaces: &mut Vec<(f64, f64)>, trace: &LtmTrace) -> Result<()> {
    let n = trace.absorbed as usize;
    if n == 0 {
        return Ok(());
    }
    let (start, width) = if trace.first {
        spaces.clear();
        (0.0, 1.0)
    } else {
        let cdf = trace.sampled_by.as_ref().map(first_row).transpose()?;
        for (a, b) in spaces.iter_mut() {
            *a = trace.tau * histogram_cdf(cdf.as_deref(), *a);
            *b = trace.tau * histogram_cdf(cdf.as_deref(), *b);
        }
        (trace.tau, 1.0 - trace.tau)
    };
    let step = width / n as f64;
    spaces.extend((0..n).map(|k| (start + k as f64 * step, start + (k + 1) as f64 * step)));
    Ok(())
}

/// The distribution function at `t` of a histogram over equal bins of `[0, 1]` (uniform
/// within each bin); `t` itself when there is no histogram.
pub fn histogram_cdf(hist: Option<&[f64]>, t: f64) -> f64 {
    let Some(h) = hist else { return t.clamp(0.0, 1.0) };
    let total: f64 = h.iter().sum();
    if total <= 0.0 {
        return t.clamp(0.0, 1.0);
    }
    let x = t.clamp(0.0, 1.0) * h.len() as f64;
    let bin = (x.floor() as usize).min(h.len() - 1);
    (h[..bin].iter().sum::<f64>() + h[bin] * (x - bin as f64)) / total
}

/// A token's space relative to an even share of the memory (1 = even), on a log colour
/// scale from 1/8 (white) to 8 times (deep red).
fn space_level(space: f64, count: usize) -> f64 {
    let relative = (space * count as f64).max(1e-12);
    ((relative.log2() + 3.0) / 6.0).clamp(0.0, 1.0)
}

/// One layer's attention histogram as SVG bars in a box at `(x, y)` of `w` by `h`, with
/// its y axis (the share of attention per bin) and a dashed line at `tau`.
fn bars(s: &mut String, hist: &[f64], (x, y, w, h): (f64, f64, f64, f64), tau: f64) {
    let top = hist.iter().cloned().fold(1e-12, f64::max);
    let bw = w / hist.len().max(1) as f64;
    let _ = writeln!(s, "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#999\"/>");
    for (i, &v) in hist.iter().enumerate() {
        let bh = h * v / top;
        let _ = writeln!(
            s,
            "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{bh:.2}\" fill=\"#c0392b\"><title>[{:.3}, {:.3}): {v:.4}</title></rect>",
            x + bw * i as f64,
            y + h - bh,
            bw,
            i as f64 / hist.len() as f64,
            (i + 1) as f64 / hist.len() as f64
        );
    }
    let _ = writeln!(s, "<text x=\"{x}\" y=\"{}\" font-size=\"11\">0 (oldest)</text><text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">1 (newest)</text>", y + h + 12.0, x + w, y + h + 12.0);
    // The y axis: the share of the attention in a bin, 0 to the largest.
    for (value, at) in [(0.0, y + h), (top / 2.0, y + h / 2.0), (top, y)] {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{value:.3}</text>",
            x - 3.0,
            at + 3.0
        );
    }
    let tx = x + w * tau;
    let _ = writeln!(
        s,
        "<line x1=\"{tx:.1}\" y1=\"{y}\" x2=\"{tx:.1}\" y2=\"{}\" stroke=\"#333\" stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"11\">τ = {tau}: older memory | the last block</text>",
        y + h,
        tx + 4.0,
        y + 11.0
    );
}

/// The picture as SVG: per layer, the attention histogram, then the absorbed text
/// shaded by memory space.
pub fn to_svg(p: &LtmPicture) -> String {
    side_by_side(&[("", p)])
}

/// Several pictures in one SVG, side by side, each under its name (`inspect ltm
/// --compare`: two runs on the same text, as the ∞-former paper's Figures 10-11 set
/// the model with and without sticky memories beside each other).
pub fn side_by_side(pictures: &[(&str, &LtmPicture)]) -> String {
    let drawn: Vec<(String, f64, f64)> = pictures.iter().map(|(_, p)| panels(p)).collect();
    let named = pictures.iter().any(|(name, _)| !name.is_empty());
    let head = if named { 22.0 } else { 0.0 };
    let width: f64 = drawn.iter().map(|d| d.1).sum();
    let height = drawn.iter().map(|d| d.2).fold(0.0, f64::max) + head;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"monospace\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let mut x = 0.0;
    for ((name, _), (body, w, _)) in pictures.iter().zip(&drawn) {
        if named {
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"16\" font-weight=\"bold\" font-size=\"15\">{}</text>",
                x + 10.0,
                super::escape(name)
            );
        }
        let _ = writeln!(s, "<g transform=\"translate({x},{head})\">\n{body}</g>");
        x += w;
    }
    s.push_str("</svg>\n");
    s
}

/// One picture's panels as SVG elements, with their width and height.
fn panels(p: &LtmPicture) -> (String, f64, f64) {
    let (cw, ch, width) = (9.0, 16.0, 100);
    let panels: Vec<Vec<(usize, usize)>> = p.spaces.iter().map(|sp| lines(&p.text.pieces[..sp.len()], width)).collect();
    let panel_height = |rows: usize| 150.0 + ch * (rows as f64 + 1.0);
    let total: f64 = panels.iter().map(|r| panel_height(r.len())).sum();
    let w = cw * width as f64 + 20.0;
    let mut s = String::new();
    let mut top = 5.0;
    for (layer, rows) in panels.iter().enumerate() {
        let _ = writeln!(s, "<text x=\"10\" y=\"{}\" font-weight=\"bold\">layer {layer}: share of the attention over the LTM's axis</text>", top + 12.0);
        bars(&mut s, &p.attention[layer], (45.0, top + 20.0, w - 55.0, 90.0), p.tau);
        let _ = writeln!(s, "<text x=\"10\" y=\"{}\" font-weight=\"bold\">memory space per token</text>", top + 140.0);
        let spaces = &p.spaces[layer];
        for (row, &(a, b)) in rows.iter().enumerate() {
            let y = top + 146.0 + ch * row as f64;
            let mut x = 10.0;
            for i in a..b {
                let pw = cw * cells(&p.text.pieces[i]) as f64;
                let space = spaces[i].1 - spaces[i].0;
                let _ = writeln!(
                    s,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{pw}\" height=\"{ch}\" fill=\"{}\" stroke=\"#eee\"><title>{space:.2e}</title></rect><text x=\"{}\" y=\"{}\">{}</text>",
                    colour(space_level(space, spaces.len())),
                    x + 1.0,
                    y + ch - 4.0,
                    glyph(&p.text.pieces[i])
                );
                x += pw;
            }
        }
        top += panel_height(rows.len());
    }
    (s, w, total + 10.0)
}

/// The picture as an HTML page: the SVG plus the tokens with the most space.
pub fn to_html(p: &LtmPicture) -> String {
    compare_html(&[("", p)])
}

/// Several pictures (see [`side_by_side`]) as one HTML page, with each one's tokens
/// that hold the most space.
pub fn compare_html(pictures: &[(&str, &LtmPicture)]) -> String {
    let mut s = String::from(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<title>lethe: ∞-former long-term memory</title>\n<style>body{font-family:sans-serif;margin:2em}code{background:#eee}</style>\n",
    );
    let _ = writeln!(
        s,
        "<h1>∞-former long-term memory</h1>\n<p>{}. Bars: the attention given to each region of the LTM, averaged over the blocks (0 = oldest, 1 = newest). Text: the share of the memory each absorbed token holds at the end (white: 1/8 of an even share or less; deep red: 8 times or more). Hover for values.</p>",
        pictures.iter().map(|(name, p)| format!("{name}{}sticky memories {}", if name.is_empty() { "" } else { ": " }, if p.sticky { "on" } else { "off" })).collect::<Vec<_>>().join("; ")
    );
    s.push_str(&side_by_side(pictures));
    for (name, p) in pictures {
        most_space(&mut s, name, p);
    }
    s
}

/// The list of the tokens with the most space, per layer of `p`.
fn most_space(s: &mut String, name: &str, p: &LtmPicture) {
    let name = if name.is_empty() { String::new() } else { format!("{}, ", super::escape(name)) };
    for (layer, spaces) in p.spaces.iter().enumerate() {
        let _ = writeln!(s, "<h2>{name}layer {layer}: the tokens with the most space</h2>\n<ol>");
        for (i, space) in largest(spaces, 10) {
            let a = i.saturating_sub(12);
            let context = super::escape(&p.text.join(a, i + 1));
            let _ =
                writeln!(s, "<li><code>{context}</code>: {:.2} times an even share</li>", space * spaces.len() as f64);
        }
        s.push_str("</ol>\n");
    }
}

/// The `k` tokens with the largest spaces: `(index, space)`, largest first.
pub fn largest(spaces: &[(f64, f64)], k: usize) -> Vec<(usize, f64)> {
    let mut all: Vec<(usize, f64)> = spaces.iter().enumerate().map(|(i, (a, b))| (i, b - a)).collect();
    all.sort_by(|x, y| y.1.total_cmp(&x.1));
    all.truncate(k);
    all
}

/// Writes `ltm.svg`, `ltm.png` and `ltm.html` into `dir`.
pub fn write(p: &LtmPicture, dir: &Path) -> Result<()> {
    write_compared(&[("", p)], dir)
}

/// Writes several named pictures side by side as `ltm.svg`, `ltm.png` and `ltm.html`
/// into `dir`.
pub fn write_compared(pictures: &[(&str, &LtmPicture)], dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| LetheError::io(dir, e))?;
    crate::plot::write_svg_and_png(&dir.join("ltm.svg"), &side_by_side(pictures))?;
    write_atomic(&dir.join("ltm.html"), compare_html(pictures).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_cdf_is_piecewise_linear() {
        let h = [1.0, 0.0, 3.0, 0.0];
        assert_eq!(histogram_cdf(Some(&h), 0.0), 0.0);
        assert_eq!(histogram_cdf(Some(&h), 0.125), 0.125);
        assert_eq!(histogram_cdf(Some(&h), 0.4), 0.25);
        assert_eq!(histogram_cdf(Some(&h), 0.625), 0.625);
        assert_eq!(histogram_cdf(Some(&h), 1.0), 1.0);
        assert_eq!(histogram_cdf(None, 0.3), 0.3);
    }

    fn trace(absorbed: i64, first: bool, sampled_by: Option<&[f64]>) -> LtmTrace {
        LtmTrace {
            attention: Tensor::ones([1, 4], (Kind::Double, tch::Device::Cpu)) / 4.0,
            absorbed,
            sampled_by: sampled_by.map(|h| Tensor::from_slice(h).view([1, -1])),
            first,
            tau: 0.5,
        }
    }

    #[test]
    fn spaces_contract_evenly_or_by_the_sticky_histogram() {
        let mut spaces = vec![];
        move_spaces(&mut spaces, &trace(2, true, None)).unwrap();
        assert_eq!(spaces, vec![(0.0, 0.5), (0.5, 1.0)]);
        move_spaces(&mut spaces, &trace(2, false, None)).unwrap();
        assert_eq!(spaces, vec![(0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0)]);
        // All attention was on the second half: the first two bytes lose their space.
        move_spaces(&mut spaces, &trace(1, false, Some(&[0.0, 0.0, 1.0, 1.0]))).unwrap();
        let widths: Vec<f64> = spaces.iter().map(|(a, b)| b - a).collect();
        assert_eq!(widths, vec![0.0, 0.0, 0.25, 0.25, 0.5]);
        assert!((widths.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(largest(&spaces, 1), vec![(4, 0.5)]);
    }
}
