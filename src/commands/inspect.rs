//! `lethe play` and `lethe inspect`: gridworld episodes as text, and pictures of what a
//! model remembers.

use std::io::Write;

use anyhow::{Context, Result};

use crate::cli::{InspectSpansArgs, PlayArgs};
use lethe::checkpoint::Checkpoint;
use lethe::config::Source;
use lethe::model::Lm;

pub(crate) fn play(a: PlayArgs) -> Result<()> {
    if a.episodes == 0 {
        anyhow::bail!("--episodes must be at least 1");
    }
    if let Some(dir) = &a.spans {
        super::decoder::check_folder("--spans", dir)?;
    }
    let mut cfg = match &a.checkpoint {
        Some(path) => a.config.resolve_over_checkpoint(lethe::checkpoint::read_config(path)?)?,
        None => a.config.resolve()?,
    };
    if !cfg.data.source.is_rl() {
        anyhow::bail!(
            "`lethe play` plays gridworlds (corridor, portal); this config's data.source is `{}`",
            cfg.data.source
        );
    }
    let device = lethe::device::parse(&cfg.train.device)?;
    let seed = a.config.seed.unwrap_or(cfg.seed);
    cfg.train.batch = 1;
    let agent = match &a.checkpoint {
        Some(path) => {
            let mut ckpt = Checkpoint::load(path)?;
            ckpt.config = cfg;
            lethe::rl::agent::Agent::from_checkpoint(&ckpt, device)?
        }
        None => lethe::rl::agent::Agent::new(&cfg, device)?,
    };
    let who = if a.checkpoint.is_some() { "a trained" } else { "an untrained" };
    // A closed pipe (`| head`) ends the process quietly (SIGPIPE); a full disk is an
    // error that stops the play.
    let mut out = std::io::stdout().lock();
    let mechanism = agent.config.memory.mechanism.name();
    let line = format!(
        "{} episode(s) of {} with {who} agent ({mechanism} memory)",
        a.episodes,
        lethe::task::describe(&agent.config)
    );
    writeln!(out, "{line}").map_err(super::stdout_failed)?;
    if let Some(dir) = &a.spans {
        let (trace, r) = lethe::inspect::agent::trace_agent(&agent, a.episodes, seed)?;
        lethe::inspect::agent::write(&trace, agent.config.data.source, dir)?;
        let mut lines = vec![r.line()];
        lines.extend(lethe::inspect::agent::summary_lines(&trace));
        lines.push(format!("wrote agent-spans.svg, .png, .html and .csv in {}", dir.display()));
        return Ok(writeln!(out, "{}", lines.join("\n")).map_err(super::stdout_failed)?);
    }
    let mut t = 0;
    let r = lethe::rl::train::play(&agent, a.episodes, seed, &mut |episodes, actions, outcomes, _| {
        let slot = &episodes.slots[0];
        t += 1;
        let written = match !a.summary || slot.done && outcomes[0].done {
            true => {
                let over = if outcomes[0].done { " (episode over)" } else { "" };
                let (action, reward) = (actions[0].name(), outcomes[0].reward);
                write!(out, "step {t}: {action}, reward {reward}{over}\n{}", slot.world.render())
                    .map_err(super::stdout_failed)
            }
            false => Ok(()),
        };
        if outcomes[0].done {
            t = 0;
        }
        written
    })?;
    Ok(writeln!(out, "{}", r.line()).map_err(super::stdout_failed)?)
}

/// The model and the text of an `inspect` command.
/// The model and the text, read as the model reads: bytes, or through its tokenizer.
pub(crate) fn inspect_inputs(a: &InspectSpansArgs, checkpoint: &std::path::Path) -> Result<(Lm, lethe::inspect::Text)> {
    let device = lethe::device::parse_flag("--device", &a.device)?;
    let ckpt = Checkpoint::load(checkpoint)?;
    let bytes = match (&a.text, a.conversation) {
        (Some(path), _) => lethe::input::read(path).map_err(|e| anyhow::anyhow!("--text `{}`: {e}", path.display()))?,
        (None, Some(n)) => conversation_text(&ckpt, &a.split, n)?.into_bytes(),
        (None, None) => anyhow::bail!("give --text FILE or --conversation N"),
    };
    let origin = a.text.clone().unwrap_or_else(|| std::path::PathBuf::from("--conversation"));
    let text = match lethe::data::text::tokenizer_of_checkpoint(&ckpt)? {
        None => lethe::inspect::Text::bytes(&bytes),
        Some(tokenizer) => lethe::inspect::Text::tokens(&tokenizer, &lethe::data::text::utf8(bytes, &origin)?)?,
    };
    Ok((Lm::from_checkpoint(&ckpt, device)?, text))
}

/// Refuses a text too long to draw ([`lethe::inspect::check_drawable`]) before it is
/// streamed, naming where it came from.
fn check_drawable(a: &InspectSpansArgs, units: usize, layers: usize) -> Result<()> {
    lethe::inspect::check_drawable(units, layers).map_err(|why| match &a.text {
        Some(path) => anyhow::anyhow!("--text `{}`: {why}", path.display()),
        None => anyhow::anyhow!("--conversation: {why}"),
    })
}

/// Conversation `n` of a dialogue run's `split`, as the model reads it.
pub(crate) fn conversation_text(ckpt: &Checkpoint, split: &str, n: usize) -> Result<String> {
    let data = &ckpt.config.data;
    if data.source != Source::Dialogue {
        anyhow::bail!(
            "--conversation: this model was trained on `{}`, not on dialogues; give --text FILE",
            data.source
        );
    }
    let dir = data.path.as_deref().context("data.path: the run names no CMU-DoG folder")?;
    let conversations = lethe::data::dialogue::read_split(dir, split.parse()?)?;
    let c = conversations.get(n).with_context(|| {
        format!(
            "--conversation {n}: the {split} split has {} conversations (0 to {})",
            conversations.len(),
            conversations.len().saturating_sub(1)
        )
    })?;
    Ok(c.segments(data.dialogue.document).into_iter().map(|(s, _)| s).collect())
}

pub(crate) fn inspect_ltm(a: InspectSpansArgs) -> Result<()> {
    super::decoder::check_folder("--out", &a.out)?;
    let mut runs = vec![a.checkpoint.clone()];
    runs.extend(a.compare.clone());
    let inputs = runs.iter().map(|run| inspect_inputs(&a, run)).collect::<Result<Vec<_>>>()?;
    let layers = inputs.iter().map(|(lm, _)| lm.config.model.layers).sum();
    check_drawable(&a, inputs.iter().map(|(_, text)| text.ids.len()).max().unwrap_or(0), layers)?;
    let mut pictures = vec![];
    for (run, (lm, text)) in runs.iter().zip(&inputs) {
        let picture = lethe::inspect::ltm::trace_ltm(lm, text).with_context(|| format!("`{}`", run.display()))?;
        pictures.push((run.display().to_string(), picture));
    }
    let named: Vec<(&str, &lethe::inspect::ltm::LtmPicture)> =
        pictures.iter().map(|(n, p)| (if runs.len() > 1 { n.as_str() } else { "" }, p)).collect();
    lethe::inspect::ltm::write_compared(&named, &a.out)?;
    for (name, picture) in &pictures {
        if runs.len() > 1 {
            println!("{name}:");
        }
        print_ltm_summary(picture);
    }
    println!("wrote {}, ltm.png and ltm.html", a.out.join("ltm.svg").display());
    Ok(())
}

/// Per layer: where the attention went on average and the tokens with the most space.
pub(crate) fn print_ltm_summary(picture: &lethe::inspect::ltm::LtmPicture) {
    let text = &picture.text;
    for (layer, (hist, spaces)) in picture.attention.iter().zip(&picture.spaces).enumerate() {
        let d = hist.len().max(1) as f64;
        let mean: f64 = hist.iter().enumerate().map(|(i, h)| h * (i as f64 + 0.5) / d).sum();
        let largest: Vec<String> = lethe::inspect::ltm::largest(spaces, 5)
            .into_iter()
            .map(|(i, space)| {
                let context = text.join(i.saturating_sub(6), i + 1).replace('\n', "\\n");
                format!("{context:?} ({:.1}x)", space * spaces.len() as f64)
            })
            .collect();
        println!(
            "layer {layer}: mean attended position {mean:.2} of [0, 1]; {} tokens absorbed; most space: {}",
            spaces.len(),
            largest.join(", ")
        );
    }
}

pub(crate) fn inspect_spans(a: InspectSpansArgs) -> Result<()> {
    if a.compare.is_some() {
        anyhow::bail!("--compare applies to `inspect ltm`, not to `inspect spans`");
    }
    super::decoder::check_folder("--out", &a.out)?;
    let (lm, text) = inspect_inputs(&a, &a.checkpoint)?;
    check_drawable(&a, text.ids.len(), lm.config.model.layers)?;
    let trace = lethe::inspect::trace_spans(&lm, &text)?;
    lethe::inspect::write(&trace, &a.out)?;
    for (layer, spans) in trace.spans.iter().enumerate() {
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_by(|&x, &y| spans[y].total_cmp(&spans[x]));
        let longest: Vec<String> = order
            .iter()
            .take(5)
            .map(|&i| {
                let context = text.join(i.saturating_sub(6), i + 1).replace('\n', "\\n");
                format!("{:?} ({:.0})", context, spans[i])
            })
            .collect();
        let mean = spans.iter().map(|&v| v as f64).sum::<f64>() / spans.len().max(1) as f64;
        println!("layer {layer}: mean span {mean:.1}; longest at {}", longest.join(", "));
    }
    println!("wrote {}, spans.png and spans.html", a.out.join("spans.svg").display());
    Ok(())
}
