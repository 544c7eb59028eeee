//! `lethe play --spans DIR`: what an Expire-Span agent keeps. The agent plays episodes
//! as `lethe play` does, and every step of the first row's episodes gets, per layer,
//! the span its memory was given (Expire-Span paper, eq. 3: `e_i = L σ(w · h_i + b)`),
//! with the room the step was taken in, its action and the door it took, if any.
//!
//! In the corridor the colour is seen at the first steps only, so an agent that learned
//! what to keep gives them long spans and the walk short ones; in the portal, what must
//! be kept is which door was taken in which room.
//!
//! Written as `agent-spans.svg` (a strip per episode: a column per step, a shaded row per
//! layer), `agent-spans.html` (the picture with the per-layer summary) and
//! `agent-spans.csv` (a line per step).

use std::fmt::Write as _;
use std::path::Path;

use tch::Kind;

use super::{colour, colour_bar, level};
use crate::checkpoint::write_atomic;
use crate::config::{Mechanism, Source};
use crate::error::{LetheError, Result};
use crate::model::Memory;
use crate::rl::agent::Agent;
use crate::rl::env::{door_taken, Episodes, World};
use crate::rl::train::{play, RlEval};

/// One step of an episode of the first row.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentStep {
    /// The episode, counted from 0 in the order the row played them.
    pub episode: usize,
    /// The step within its episode, from 0.
    pub step: usize,
    /// The room the step was taken in (1-based; portal only).
    pub room: Option<usize>,
    /// The move, as a letter (`U`, `D`, `L`, `R`).
    pub action: char,
    /// The step's reward.
    pub reward: f64,
    /// The door the step went through: `Some(true)` right, `Some(false)` wrong.
    pub door: Option<bool>,
    /// Per layer, the span given to this step's memory (steps).
    pub spans: Vec<f32>,
}

/// The steps an agent played, with their spans.
#[derive(Clone, Debug)]
pub struct AgentTrace {
    /// Every step of the first row's episodes, in order.
    pub steps: Vec<AgentStep>,
    /// Layers of the model.
    pub layers: usize,
    /// The maximum span `L` (the top of the colour scale).
    pub max_span: f64,
}

/// Mean spans of one layer over kinds of steps (None where there was no such step).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpans {
    /// Over every step.
    pub all: Option<f64>,
    /// Over the first step of each episode.
    pub first: Option<f64>,
    /// Over the steps that went through a right door.
    pub right: Option<f64>,
    /// Over the steps that went through a wrong door.
    pub wrong: Option<f64>,
    /// Over the other steps.
    pub rest: Option<f64>,
}

/// The first row's view of the game so far: the episode it is in and that episode's
/// door counters ([`crate::rl::env::World::progress`]) after the last step watched.
struct Follow {
    number: u64,
    episode: usize,
    step: usize,
    progress: (usize, usize),
}

/// Plays `episodes` episodes as [`play`] does and records every step of the first
/// row's episodes. The agent must use Expire-Span, the only memory that gives spans.
pub fn trace_agent(agent: &Agent, episodes: usize, seed: u64) -> Result<(AgentTrace, RlEval)> {
    let cfg = &agent.config;
    if cfg.memory.mechanism != Mechanism::Expire {
        return Err(LetheError::Invalid(format!(
            "`--spans` needs an Expire-Span agent (memory.mechanism = \"expire\"); this one's memory is {}",
            cfg.memory.mechanism.name()
        )));
    }
    let mut steps = vec![];
    let mut follow: Option<Follow> = None;
    let eval = play(agent, episodes, seed, &mut |eps, actions, outcomes, mem| {
        if eps.slots[0].done && !outcomes[0].done {
            return Ok(()); // the row is idle (batch mode)
        }
        steps.push(record(eps, actions[0].letter(), outcomes[0].reward, mem, &mut follow)?);
        Ok(())
    })?;
    Ok((AgentTrace { steps, layers: cfg.model.layers, max_span: cfg.memory.span as f64 }, eval))
}

/// The first row's step just taken, with the spans its memory was given.
fn record(eps: &Episodes, action: char, reward: f64, mem: &Memory, follow: &mut Option<Follow>) -> Result<AgentStep> {
    let slot = &eps.slots[0];
    let before = match follow {
        Some(f) if f.number == slot.number => Follow { step: f.step + 1, ..*f },
        Some(f) => Follow { number: slot.number, episode: f.episode + 1, step: 0, progress: (0, 0) },
        None => Follow { number: slot.number, episode: 0, step: 0, progress: (0, 0) },
    };
    let after = slot.world.progress();
    let portal = matches!(slot.world, World::Portal(_));
    let step = AgentStep {
        episode: before.episode,
        step: before.step,
        room: portal.then_some(before.progress.0 + 1),
        action,
        reward,
        door: door_taken(before.progress, after),
        spans: first_row_spans(mem)?,
    };
    *follow = Some(Follow { progress: after, ..before });
    Ok(step)
}

/// Per layer, the span of the first row's newest memory.
fn first_row_spans(mem: &Memory) -> Result<Vec<f32>> {
    mem.token_spans()
        .into_iter()
        .map(|s| {
            let s = s.ok_or_else(|| LetheError::Invalid("the memory gave no spans for the step".into()))?;
            // (b, m) with m = 1: one step per call.
            let row: Vec<f32> =
                s.get(0).to_kind(Kind::Float).to_device(tch::Device::Cpu).flatten(0, -1).try_into().unwrap_or_default();
            row.last().copied().ok_or_else(|| LetheError::Invalid("the memory gave an empty span row".into()))
        })
        .collect()
}

/// Mean spans per layer over every step, first steps, right and wrong doors, and the
/// steps that took no door.
pub fn summarise(trace: &AgentTrace) -> Vec<LayerSpans> {
    let mean = |keep: &dyn Fn(&AgentStep) -> bool, layer: usize| {
        let v: Vec<f64> = trace.steps.iter().filter(|s| keep(s)).map(|s| s.spans[layer] as f64).collect();
        (!v.is_empty()).then(|| crate::metrics::mean(&v))
    };
    (0..trace.layers)
        .map(|l| LayerSpans {
            all: mean(&|_| true, l),
            first: mean(&|s| s.step == 0, l),
            right: mean(&|s| s.door == Some(true), l),
            wrong: mean(&|s| s.door == Some(false), l),
            rest: mean(&|s| s.door.is_none(), l),
        })
        .collect()
}

/// One line per layer, for the terminal.
pub fn summary_lines(trace: &AgentTrace) -> Vec<String> {
    summarise(trace)
        .iter()
        .enumerate()
        .map(|(l, s)| {
            // A kind of step the episodes never took has no mean: `-`.
            let shown = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
            format!(
                "layer {l}: mean span {} over {} steps; first steps {}, right doors {}, wrong doors {}, no door {}",
                shown(s.all),
                trace.steps.len(),
                shown(s.first),
                shown(s.right),
                shown(s.wrong),
                shown(s.rest)
            )
        })
        .collect()
}

/// A line per step: `episode,step,room,action,reward,door,span_0,...`.
pub fn to_csv(trace: &AgentTrace) -> Result<String> {
    let mut w = csv::Writer::from_writer(vec![]);
    let mut header: Vec<String> = ["episode", "step", "room", "action", "reward", "door"].map(String::from).to_vec();
    header.extend((0..trace.layers).map(|l| format!("span_{l}")));
    w.write_record(&header)?;
    for s in &trace.steps {
        let door = match s.door {
            Some(true) => "right",
            Some(false) => "wrong",
            None => "",
        };
        let mut record = vec![
            s.episode.to_string(),
            s.step.to_string(),
            s.room.map_or(String::new(), |r| r.to_string()),
            s.action.to_string(),
            s.reward.to_string(),
            door.to_string(),
        ];
        record.extend(s.spans.iter().map(|v| v.to_string()));
        w.write_record(&record)?;
    }
    crate::metrics::records_text(w)
}

/// Steps per line of the picture.
const WIDTH: usize = 40;

/// Height of the picture's [`legend`] band.
const LEGEND: f64 = 46.0;

/// The trace as an SVG image: a legend (what the marks mean, and a colour bar of the
/// span from 0 to `L`), then per episode lines of up to 40 steps, each a column with the
/// room, the action and the door taken (`+` right, `x` wrong) above one shaded cell per
/// layer holding the span.
pub fn to_svg(trace: &AgentTrace) -> String {
    let (cw, ch) = (26.0, 16.0);
    let band = ch * (header_rows(trace).len() + trace.layers) as f64 + 10.0;
    let w = 70.0 + cw * WIDTH as f64;
    let mut body = legend(trace, w);
    let mut y = LEGEND + 10.0;
    let mut episode = usize::MAX;
    let lines = trace.steps.chunk_by(|a, b| a.episode == b.episode).flat_map(|e| e.chunks(WIDTH));
    for line in lines {
        if line[0].episode != episode {
            episode = line[0].episode;
            let _ =
                writeln!(body, "<text x=\"10\" y=\"{}\" font-weight=\"bold\">episode {}</text>", y + 12.0, episode + 1);
            y += ch + 4.0;
        }
        body.push_str(&svg_line(trace, line, y, cw, ch));
        y += band;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"monospace\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n",
        y + 10.0
    )
}

/// The picture's legend, in a band [`LEGEND`] high across `w`: the marks on the left,
/// the colour bar of the span on the right.
fn legend(trace: &AgentTrace, w: f64) -> String {
    let mut s = String::new();
    let lines = [
        "each cell: the span the layer gave that step's memory, in steps (it stays visible for its span plus the ramp)",
        "move: U up, D down, L left, R right; + took the right door, x a wrong one",
    ];
    for (i, line) in lines.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{}\" font-family=\"sans-serif\" font-size=\"12\">{line}</text>",
            18.0 + 16.0 * i as f64
        );
    }
    let max = trace.max_span;
    colour_bar(&mut s, (w - 230.0, 8.0, 200.0), "span", colour, |t| format!("{:.0}", t * max));
    s
}

/// The rows above the spans: the room only for the portal.
fn header_rows(trace: &AgentTrace) -> Vec<&'static str> {
    if trace.steps.iter().any(|s| s.room.is_some()) {
        vec!["step", "room", "move"]
    } else {
        vec!["step", "move"]
    }
}

/// One line of up to [`WIDTH`] steps, its top at `y`.
fn svg_line(trace: &AgentTrace, line: &[AgentStep], y: f64, cw: f64, ch: f64) -> String {
    let mut s = String::new();
    let mut labels = header_rows(trace);
    let rows = labels.len();
    let names: Vec<String> = (0..trace.layers).map(|l| format!("layer {l}")).collect();
    labels.extend(names.iter().map(String::as_str));
    for (row, label) in labels.iter().enumerate() {
        let _ = writeln!(s, "<text x=\"10\" y=\"{}\" fill=\"#555\">{label}</text>", y + ch * (row as f64 + 1.0) - 4.0);
    }
    for (col, st) in line.iter().enumerate() {
        let x = 60.0 + cw * col as f64;
        let door = match st.door {
            Some(true) => "+",
            Some(false) => "x",
            None => "",
        };
        let mut top = vec![(st.step + 1).to_string(), format!("{}{door}", st.action)];
        if let Some(room) = st.room.filter(|_| rows == 3) {
            top.insert(1, room.to_string());
        }
        for (row, text) in top.iter().enumerate() {
            let _ = writeln!(s, "<text x=\"{}\" y=\"{}\">{text}</text>", x + 3.0, y + ch * (row as f64 + 1.0) - 4.0);
        }
        for (l, &span) in st.spans.iter().enumerate() {
            let cy = y + ch * (rows + l) as f64;
            let _ = writeln!(
                s,
                "<rect x=\"{x}\" y=\"{cy}\" width=\"{cw}\" height=\"{ch}\" fill=\"{}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\">{span:.0}</text>",
                colour(level(span, trace.max_span)),
                x + 3.0,
                cy + ch - 4.0
            );
        }
    }
    s
}

/// The picture and the summary as an HTML page.
pub fn to_html(trace: &AgentTrace, task: Source) -> String {
    let mut s = String::from(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<title>lethe: what the agent keeps</title>\n<style>body{font-family:sans-serif;margin:2em}</style>\n",
    );
    let _ = writeln!(
        s,
        "<h1>Expire-spans of an agent's steps ({task})</h1>\n<p>Each step's memory is kept for its span plus the ramp (number in the cell; darker: longer, linear from 0 to L = {:.0}). Moves: U, D, L, R; <b>+</b> a right door, <b>x</b> a wrong one.</p>\n<ul>",
        trace.max_span
    );
    for line in summary_lines(trace) {
        let _ = writeln!(s, "<li>{line}</li>");
    }
    s.push_str("</ul>\n");
    s.push_str(&to_svg(trace));
    s
}

/// Writes `agent-spans.svg`, `agent-spans.png`, `agent-spans.html` and `agent-spans.csv`
/// into `dir`.
pub fn write(trace: &AgentTrace, task: Source, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| LetheError::io(dir, e))?;
    crate::plot::write_svg_and_png(&dir.join("agent-spans.svg"), &to_svg(trace))?;
    write_atomic(&dir.join("agent-spans.html"), to_html(trace, task).as_bytes())?;
    write_atomic(&dir.join("agent-spans.csv"), to_csv(trace)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(episode: usize, step: usize, door: Option<bool>, spans: Vec<f32>) -> AgentStep {
        AgentStep { episode, step, room: Some(1), action: 'U', reward: 0.0, door, spans }
    }

    #[test]
    fn spans_are_averaged_by_kind_of_step() {
        let trace = AgentTrace {
            steps: vec![
                step(0, 0, None, vec![10.0, 1.0]),
                step(0, 1, Some(false), vec![20.0, 2.0]),
                step(1, 0, None, vec![30.0, 3.0]),
                step(1, 1, None, vec![0.0, 4.0]),
                step(1, 2, Some(true), vec![40.0, 5.0]),
            ],
            layers: 2,
            max_span: 64.0,
        };
        let s = summarise(&trace);
        assert_eq!(
            s[0],
            LayerSpans {
                all: Some(20.0),
                first: Some(20.0),
                right: Some(40.0),
                wrong: Some(20.0),
                rest: Some(40.0 / 3.0)
            }
        );
        assert_eq!(
            s[1],
            LayerSpans { all: Some(3.0), first: Some(2.0), right: Some(5.0), wrong: Some(2.0), rest: Some(8.0 / 3.0) }
        );
        assert!(summary_lines(&trace)[1].contains("right doors 5.0, wrong doors 2.0"), "{:?}", summary_lines(&trace));
        let csv = to_csv(&trace).unwrap();
        assert_eq!(csv.lines().next(), Some("episode,step,room,action,reward,door,span_0,span_1"));
        assert_eq!(csv.lines().nth(2), Some("0,1,1,U,0,wrong,20,2"));
        assert_eq!(csv.lines().count(), 6);
        let svg = to_svg(&trace);
        assert_eq!(svg.matches("stroke=\"#ddd\"").count(), 10, "a cell per step and layer");
        assert!(
            svg.contains("+ took the right door, x a wrong one") && svg.contains(">span</text>"),
            "the legend and the colour bar"
        );
        assert!(svg.contains(">64</text>"), "the colour bar ends at L");
        let html = to_html(&trace, Source::Portal);
        assert!(html.contains("(portal)") && html.contains("linear"), "user-facing names, the scale as drawn");
        assert_eq!(svg.matches(">episode ").count(), 2);
    }

    #[test]
    fn a_kind_of_step_never_taken_is_shown_as_a_dash_not_nan() {
        // Regression: an agent that never took a wrong door printed `wrong doors NaN`.
        let trace = AgentTrace {
            steps: vec![step(0, 0, None, vec![10.0]), step(0, 1, Some(true), vec![20.0])],
            layers: 1,
            max_span: 64.0,
        };
        let line = &summary_lines(&trace)[0];
        assert!(line.ends_with("right doors 20.0, wrong doors -, no door 10.0"), "{line}");
    }

    #[test]
    fn a_long_episode_is_drawn_in_lines_of_forty_steps() {
        let steps = (0..90).map(|t| step(0, t, None, vec![1.0])).collect();
        let svg = to_svg(&AgentTrace { steps, layers: 1, max_span: 8.0 });
        assert_eq!(svg.matches(">layer 0<").count(), 3, "40 + 40 + 10 steps");
        assert_eq!(svg.matches(">episode ").count(), 1);
    }
}
