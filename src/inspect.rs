//! `lethe inspect spans`: what an Expire-Span model keeps. A text is streamed through
//! the model (memory carried, no dropout) and every byte gets, per layer, the span its
//! memory was given; the result is drawn as an SVG image and an HTML page with one row
//! per layer, each byte shaded by its span (paper Figures 8 and 11). Edit the text and
//! re-run to repeat the paper's probes ("Egypt", "somewhere", "Humpty Dumpty").
//!
//! `lethe inspect ltm` ([`ltm`]) does the same for an ∞-former's long-term memory, and
//! `lethe play --spans` ([`agent`]) for the steps of an Expire-Span agent's episodes.

pub mod agent;
pub mod ltm;

use std::fmt::Write as _;
use std::path::Path;

use tch::Tensor;

use crate::checkpoint::write_atomic;
use crate::data::tokenizer::Tokenizer;
use crate::data::Token;
use crate::error::{LetheError, Result};
use crate::model::{Lm, Memory};

/// A text to inspect: the ids the model reads and how each is shown.
#[derive(Clone, Debug)]
pub struct Text {
    /// Token ids: bytes for a byte-level model, else the tokenizer's.
    pub ids: Vec<Token>,
    /// What each id stands for: a byte's character (`·` when it is not printable
    /// ASCII), or a token's text (`·` for part of a character).
    pub pieces: Vec<String>,
}

impl Text {
    /// The bytes of a text, each its own token.
    pub fn bytes(bytes: &[u8]) -> Text {
        let piece = |b: u8| match b {
            b'\n' | 32..=126 => (b as char).to_string(),
            _ => "·".to_string(),
        };
        Text { ids: bytes.iter().map(|&b| b as Token).collect(), pieces: bytes.iter().map(|&b| piece(b)).collect() }
    }

    /// `text` through `tokenizer`, each token shown as its own text.
    pub fn tokens(tokenizer: &Tokenizer, text: &str) -> Result<Text> {
        let ids = crate::data::text::encode_long(tokenizer, text)?;
        let mut pieces = Vec::with_capacity(ids.len());
        for &id in &ids {
            let piece = tokenizer.decode(&[id])?;
            let piece = if piece.contains('\u{FFFD}') { "·".to_string() } else { piece };
            // Words of a word vocabulary are shown with the space between them.
            pieces.push(if tokenizer.spaced() { format!("{piece} ") } else { piece });
        }
        Ok(Text { ids, pieces })
    }

    /// The pieces `a..b` joined.
    pub fn join(&self, a: usize, b: usize) -> String {
        self.pieces[a..b.min(self.pieces.len())].concat()
    }
}

/// The most token cells the pictures draw, over every layer (and every run drawn side
/// by side): each cell is three SVG elements, and the PNG's renderer (usvg) refuses an
/// image of more than a million. A longer text is refused before it is streamed.
pub const MAX_CELLS: usize = 200_000;

/// Refuses a text of `units` tokens drawn in `layers` panels in all when the pictures
/// would hold more than [`MAX_CELLS`] cells; the reason says how long a text may be.
pub fn check_drawable(units: usize, layers: usize) -> std::result::Result<(), String> {
    let cells = units.saturating_mul(layers);
    if cells <= MAX_CELLS {
        return Ok(());
    }
    let fits = MAX_CELLS / layers.max(1);
    Err(format!(
        "{units} tokens in each of {layers} layer panels make {cells} cells; the pictures draw at most {MAX_CELLS}: give a text of at most {fits} tokens (bytes, for a byte-level model), e.g. `head -c {fits} FILE`"
    ))
}

/// Spans per layer for every token of a text.
#[derive(Clone, Debug)]
pub struct SpanTrace {
    /// The text.
    pub text: Text,
    /// `spans[layer][i]`: the span predicted for token `i` at that layer.
    pub spans: Vec<Vec<f32>>,
    /// The maximum span `L` (the top of the colour scale).
    pub max_span: f64,
}

/// Streams `text` through `lm` as one stream, in blocks of its training length, with
/// the memory carried and no gradient; `after_block` sees the memory after each block.
fn stream_text(lm: &Lm, text: &[Token], mut after_block: impl FnMut(&Memory) -> Result<()>) -> Result<()> {
    if text.is_empty() {
        return Err(LetheError::Invalid("the text to inspect is empty".into()));
    }
    let _guard = tch::no_grad_guard();
    let mut mem = lm.model.new_memory();
    for chunk in text.chunks(lm.config.train.block.max(1)) {
        let ids: Vec<i64> = chunk.iter().map(|&t| t as i64).collect();
        let x = Tensor::from_slice(&ids).view([1, -1]).to_device(lm.device());
        lm.model.forward(&x, &mut mem, false)?;
        after_block(&mem)?;
    }
    Ok(())
}

/// Streams `text` through `lm` in blocks of its training length and records the spans.
pub fn trace_spans(lm: &Lm, text: &Text) -> Result<SpanTrace> {
    let mut spans = vec![Vec::with_capacity(text.ids.len()); lm.config.model.layers];
    stream_text(lm, &text.ids, |mem| {
        for (layer, s) in mem.token_spans().into_iter().enumerate() {
            let s = s.ok_or_else(|| {
                LetheError::Invalid(format!(
                    "`{}` memory predicts no spans; `inspect spans` needs an Expire-Span model",
                    lm.config.memory.mechanism
                ))
            })?;
            spans[layer].extend(crate::model::host_values(&s)?.into_iter().map(|v| v as f32));
        }
        Ok(())
    })?;
    Ok(SpanTrace { text: text.clone(), spans, max_span: lm.config.memory.span as f64 })
}

/// Colour scale position in [0, 1]: linear in the span, 0 to the maximum span `L` (a log
/// scale gave spans of 30 and 139 one colour).
fn level(span: f32, max_span: f64) -> f64 {
    (span.max(0.0) as f64 / max_span.max(1e-9)).clamp(0.0, 1.0)
}

/// A colour bar of `to_colour` over `[0, 1]` at `(x, y)`, `w` wide, with its ends and
/// middle labelled by `label(t)`, and a caption before it.
fn colour_bar(
    s: &mut String,
    (x, y, w): (f64, f64, f64),
    caption: &str,
    to_colour: impl Fn(f64) -> String,
    label: impl Fn(f64) -> String,
) {
    let cells = 20;
    let cell = w / cells as f64;
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-family=\"sans-serif\" font-size=\"12\">{}</text>",
        x - 8.0,
        y + 11.0,
        crate::metrics::html_escape(caption)
    );
    for i in 0..cells {
        let t = (i as f64 + 0.5) / cells as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{:.1}\" y=\"{y}\" width=\"{:.1}\" height=\"12\" fill=\"{}\"/>",
            x + cell * i as f64,
            cell + 0.5,
            to_colour(t)
        );
    }
    let _ = writeln!(s, "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"12\" fill=\"none\" stroke=\"#999\"/>");
    for (t, anchor) in [(0.0, "start"), (0.5, "middle"), (1.0, "end")] {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"{anchor}\" font-family=\"sans-serif\" font-size=\"11\">{}</text>",
            x + w * t,
            y + 25.0,
            label(t)
        );
    }
}

/// White to deep red.
fn colour(level: f64) -> String {
    let g = (255.0 * (1.0 - 0.85 * level)) as u8;
    let b = (255.0 * (1.0 - level)) as u8;
    format!("rgb(255,{g},{b})")
}

/// A piece as markup: HTML characters escaped, a newline as `↵`, other control
/// characters as `·`.
fn glyph(piece: &str) -> String {
    let shown: String = piece
        .chars()
        .map(|c| {
            if c == '\n' {
                '↵'
            } else if c.is_control() {
                '·'
            } else {
                c
            }
        })
        .collect();
    crate::metrics::html_escape(&shown)
}

/// The cells a piece takes in a picture (one per character, at least one).
fn cells(piece: &str) -> usize {
    piece.chars().count().max(1)
}

/// Text with the HTML markup characters escaped and newlines shown as `↵`.
fn escape(text: &str) -> String {
    crate::metrics::html_escape(text).replace('\n', "↵")
}

/// Lines of pieces at most `width` cells wide (a longer piece gets a line of its own),
/// also broken after each newline: `(start, end)` pairs of piece indices.
fn lines(pieces: &[String], width: usize) -> Vec<(usize, usize)> {
    let mut out = vec![];
    let (mut start, mut used) = (0, 0);
    for (i, piece) in pieces.iter().enumerate() {
        if used > 0 && used + cells(piece) > width {
            out.push((start, i));
            (start, used) = (i, 0);
        }
        used += cells(piece);
        if piece.ends_with('\n') {
            out.push((start, i + 1));
            (start, used) = (i + 1, 0);
        }
    }
    if start < pieces.len() {
        out.push((start, pieces.len()));
    }
    out
}

/// The trace as an SVG image: one panel per layer, each byte a shaded cell.
pub fn to_svg(trace: &SpanTrace) -> String {
    let (cw, ch, width) = (9.0, 16.0, 100);
    let rows = lines(&trace.text.pieces, width);
    let panel = ch * (rows.len() as f64 + 1.5);
    let legend = 40.0;
    let (w, h) = (cw * width as f64 + 20.0, legend + panel * trace.spans.len() as f64 + 10.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"monospace\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let max = trace.max_span;
    colour_bar(&mut s, (w - 330.0, 8.0, 300.0), "span given to each token (tokens)", colour, |t| {
        format!("{:.0}", t * max)
    });
    for (layer, spans) in trace.spans.iter().enumerate() {
        let top = legend + layer as f64 * panel + 5.0;
        let _ = writeln!(s, "<text x=\"10\" y=\"{}\" font-weight=\"bold\">layer {layer}</text>", top + ch - 3.0);
        for (row, &(a, b)) in rows.iter().enumerate() {
            let y = top + ch * (row as f64 + 1.2);
            let mut x = 10.0;
            for (&span, piece) in spans[a..b].iter().zip(&trace.text.pieces[a..b]) {
                let pw = cw * cells(piece) as f64;
                let _ = writeln!(
                    s,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{pw}\" height=\"{ch}\" fill=\"{}\" stroke=\"#eee\"><title>{span:.0}</title></rect><text x=\"{}\" y=\"{}\">{}</text>",
                    colour(level(span, trace.max_span)),
                    x + 1.0,
                    y + ch - 4.0,
                    glyph(piece)
                );
                x += pw;
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The trace as an HTML page: one section per layer; hover a byte to read its span.
pub fn to_html(trace: &SpanTrace) -> String {
    let mut s = String::from(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<title>lethe: expire-spans</title>\n<style>body{font-family:sans-serif;margin:2em}pre{font-family:monospace;font-size:14px;line-height:1.5;white-space:pre-wrap}</style>\n",
    );
    let _ = writeln!(s, "<h1>Expire-spans per token</h1>\n<p>Darker: kept longer (linear scale, white = 0, deep red = L = {:.0} tokens). Hover a token for its span.</p>", trace.max_span);
    for (layer, spans) in trace.spans.iter().enumerate() {
        let mean = spans.iter().map(|&v| v as f64).sum::<f64>() / spans.len().max(1) as f64;
        let _ = writeln!(s, "<h2>Layer {layer} (mean span {mean:.1})</h2>\n<pre>");
        for (i, piece) in trace.text.pieces.iter().enumerate() {
            let newline = if piece.ends_with('\n') { "\n" } else { "" };
            let shown = format!("{}{newline}", glyph(piece));
            let _ = write!(
                s,
                "<span style=\"background:{}\" title=\"{:.0}\">{shown}</span>",
                colour(level(spans[i], trace.max_span)),
                spans[i]
            );
        }
        s.push_str("</pre>\n");
    }
    s
}

/// Writes `spans.svg`, `spans.png` and `spans.html` into `dir`.
pub fn write(trace: &SpanTrace, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| LetheError::io(dir, e))?;
    crate::plot::write_svg_and_png(&dir.join("spans.svg"), &to_svg(trace))?;
    write_atomic(&dir.join("spans.html"), to_html(trace).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_break_at_width_and_after_newlines() {
        let bytes = Text::bytes(b"abcdef\ngh");
        assert_eq!(lines(&bytes.pieces, 4), vec![(0, 4), (4, 7), (7, 9)]);
        // Pieces of several characters: a line holds what fits, a long piece stands alone.
        let pieces: Vec<String> = ["ab", "cd", "e\n", "fghijk", "l"].iter().map(|s| s.to_string()).collect();
        assert_eq!(lines(&pieces, 4), vec![(0, 2), (2, 3), (3, 4), (4, 5)]);
    }

    #[test]
    fn longer_spans_are_darker_and_markup_is_escaped() {
        assert!(level(10.0, 100.0) < level(90.0, 100.0));
        assert_eq!(level(100.0, 100.0), 1.0);
        let trace = SpanTrace { text: Text::bytes(b"<a&"), spans: vec![vec![0.0, 50.0, 100.0]], max_span: 100.0 };
        let html = to_html(&trace);
        assert!(html.contains("&lt;") && html.contains("&amp;") && !html.contains("<a&"));
        assert!(html.contains("title=\"50\""));
        let svg = to_svg(&trace);
        assert_eq!(
            svg.matches("<rect x=").count(),
            3 + 20 + 1,
            "a cell per byte, then the colour bar's cells and frame"
        );
        assert!(svg.contains(">50</text>") && svg.contains(">100</text>"), "the bar's middle and end are labelled");
        assert!(svg.contains("rgb(255,255,255)") && svg.contains("rgb(255,38,0)"));
    }
}
