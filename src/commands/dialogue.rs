//! `lethe chat`, `dialogue-eval`, `dialogue-data` and `score`: document-grounded dialogue
//! and the scores of generated text.

use std::io::Write;

use anyhow::{Context, Result};

use crate::cli::{ChatArgs, DialogueDataArgs, DialogueEvalArgs, ReplyArgs, ScoreArgs};
use lethe::config::Source;
use lethe::data::Split;
use lethe::generate::Sampling;
use lethe::model::Lm;

use super::train::{load_checkpoint, same_tokenizer};

/// The widest beam `--beam` takes.
pub(crate) const MAX_BEAM: usize = 256;

/// The longest reply `--max-length` takes, in tokens: a reply is one turn (the official
/// evaluation stops at 50), and an untrained model, which never says its turn is over,
/// would otherwise write for hours with nothing shown.
pub(crate) const MAX_REPLY: usize = 4096;

/// The decoding that --decode and its options describe.
pub(crate) fn decoding(a: &ReplyArgs) -> Result<lethe::dialogue::Decoding> {
    use lethe::dialogue::Decoding;
    if a.max_length == 0 {
        anyhow::bail!("--max-length 0: a reply needs room for at least one token");
    }
    if a.max_length > MAX_REPLY {
        anyhow::bail!("--max-length {}: at most {MAX_REPLY} tokens a reply (a reply is one turn)", a.max_length);
    }
    let (beam, sampling) =
        (a.beam, Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed });
    let d = match a.decode.as_str() {
        "greedy" => Decoding::Sample(Sampling { temperature: 0.0, top_p: 1.0, ..sampling }),
        "sample" => Decoding::Sample(sampling),
        "beam" if beam == 0 => anyhow::bail!("--beam 0: a beam needs at least one hypothesis"),
        // Each hypothesis carries a copy of the model's memory.
        "beam" if beam > MAX_BEAM => {
            anyhow::bail!("--beam {beam}: at most {MAX_BEAM} hypotheses (each carries a copy of the model's memory)")
        }
        "beam" => Decoding::Beam { width: beam },
        other => anyhow::bail!("--decode {other}: must be greedy, sample or beam"),
    };
    if let Decoding::Sample(s) = &d {
        s.validate()?;
    }
    Ok(d)
}

/// Talks about a document: one reply on stdout per line on stdin.
pub(crate) fn chat(a: ChatArgs) -> Result<()> {
    use lethe::dialogue::{Chat, Codec};
    let device = lethe::device::parse_flag("--device", &a.device)?;
    let decoding = decoding(&a.reply)?;
    let bytes =
        lethe::input::read(&a.document).map_err(|e| anyhow::anyhow!("--document `{}`: {e}", a.document.display()))?;
    let document = lethe::data::text::utf8(bytes, &a.document)?;
    if document.trim().is_empty() {
        anyhow::bail!("`{}` holds no text to talk about", a.document.display());
    }
    let ckpt = load_checkpoint(&a.checkpoint, None)?;
    refuse_other_than_dialogue(&ckpt.config)?;
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
    let mut chat = Chat::new(&lm, Codec::new(tokenizer.as_ref())?, &document, decoding, a.reply.max_length)?;
    lethe::say!(
        "read `{}` (memory held per layer: {:?}); type a line, end with Ctrl-D",
        a.document.display(),
        chat.memory_held()
    );
    let stdout = std::io::stdout();
    let mut stdin = std::io::stdin().lock();
    while let Some(line) = bounded_line(&mut stdin)? {
        if line.trim().is_empty() {
            continue;
        }
        let answer = chat.turn(&line)?;
        writeln!(stdout.lock(), "{answer}").map_err(super::stdout_failed)?;
    }
    Ok(())
}

/// Refuses a model trained on anything but dialogues: it knows neither the document nor
/// the turns' markers.
fn refuse_other_than_dialogue(cfg: &lethe::config::Config) -> Result<()> {
    if cfg.data.source != Source::Dialogue {
        anyhow::bail!(
            "--checkpoint: this model was trained on `{}`, not on dialogues (data.source = \"dialogue\")",
            cfg.data.source
        );
    }
    Ok(())
}

/// The longest line `lethe chat` reads from standard input.
pub(crate) const MAX_LINE_BYTES: u64 = 1 << 20;

/// The next line of `input` without its newline, `None` at the end; a line longer than
/// [`MAX_LINE_BYTES`] (an endless input without newlines, as `/dev/zero`) is refused
/// when its limit is reached, not read into memory whole.
pub(crate) fn bounded_line(input: &mut impl std::io::BufRead) -> Result<Option<String>> {
    use std::io::{BufRead, Read};
    let mut bytes = vec![];
    let read = input.take(MAX_LINE_BYTES + 1).read_until(b'\n', &mut bytes).context("reading standard input")?;
    if read == 0 {
        return Ok(None);
    }
    if bytes.len() as u64 > MAX_LINE_BYTES {
        anyhow::bail!("standard input: a line longer than {} MiB; a turn is one line of text", MAX_LINE_BYTES >> 20);
    }
    let text =
        String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("standard input: a line that is not UTF-8 text"))?;
    Ok(Some(text.trim_end_matches(['\n', '\r']).to_string()))
}

/// Replies to a dialogue split and scores them, with the true responses' perplexity.
pub(crate) fn dialogue_eval(a: DialogueEvalArgs) -> Result<()> {
    use lethe::dialogue::{respond_to_split, Codec, Options};
    let device = lethe::device::parse_flag("--device", &a.device)?;
    let decoding = decoding(&a.reply)?;
    let split: Split = a.split.parse()?;
    let ckpt = load_checkpoint(&a.checkpoint, None)?;
    let mut cfg = same_tokenizer(&ckpt.config, ckpt.config.clone().apply_overrides(&a.overrides)?)?;
    if let Some(path) = &a.data {
        cfg.data.path = Some(path.clone());
    }
    cfg.validate()?;
    refuse_other_than_dialogue(&cfg)?;
    let dir = cfg.data.path.clone().context("data.path: the CMU-DoG folder is needed (--data DIR)")?;
    if let Some(path) = &a.csv {
        let checkpoint = lethe::checkpoint::resolve(&a.checkpoint);
        lethe::output::check("--csv", path, &[&checkpoint, &dir, a.wordnet.as_deref().unwrap_or(&dir)])?;
    }
    let mut conversations = lethe::data::dialogue::read_split(&dir, split)?;
    if a.conversations > 0 {
        conversations.truncate(a.conversations);
    }
    let scorer = scorer(a.wordnet.as_deref())?;
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
    let codec = Codec::new(tokenizer.as_ref())?;
    let opts = Options {
        decoding,
        max_length: a.reply.max_length,
        min_history: a.min_history,
        with_document: cfg.data.dialogue.document,
    };
    let started = std::time::Instant::now();
    let mut said = started;
    let replies = respond_to_split(&lm, &codec, &conversations, &opts, &scorer, |done, total| {
        if said.elapsed().as_secs() >= 10 && done < total {
            said = std::time::Instant::now();
            lethe::say!("replying: {done}/{total} conversations ({:.0} s)", started.elapsed().as_secs_f64());
        }
    })?;
    let scores: Vec<_> = replies.iter().map(|r| r.scores).collect();
    let mean = lethe::textmetrics::mean(&scores)
        .context("no turn to reply to: every conversation has at most --min-history turns")?;
    // Perplexity of the true responses, over the same conversations, read through the
    // replies' tokenizer (the run's own copy).
    let data = lethe::data::dialogue::split_data(tokenizer.as_ref(), &cfg.data.dialogue, &conversations, &dir, split)?;
    let ppl = lethe::eval::evaluate(&lm, &data, 1, cfg.train.block, None)?;
    if let Some(path) = &a.csv {
        lethe::output::write("--csv", path, &lethe::dialogue::replies_csv(&replies)?, &[])?;
        lethe::say!("wrote {}", path.display());
    }
    if a.json {
        let out = serde_json::json!({"split": split.to_string(), "conversations": conversations.len(), "replies": replies.len(), "ppl": ppl.ppl, "word_ppl": ppl.word_ppl, "scores": mean, "meteor_synonyms": scorer.wordnet().is_some()});
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{split}: {} replies in {} conversations ({} decoding), perplexity of the true responses {}",
            replies.len(),
            conversations.len(),
            a.reply.decode,
            lethe::metrics::format_perplexity(ppl.ppl, 2)
        );
        println!("{}", lethe::textmetrics::summary(&mean, replies.len(), scorer.wordnet().is_some()));
    }
    Ok(())
}

/// Writes the generated dialogue data set.
pub(crate) fn dialogue_data(a: DialogueDataArgs) -> Result<()> {
    let w = lethe::data::dialogue::synthetic::write(&a.out, a.conversations, a.seed)?;
    let [train, valid, test] = w.counts;
    println!("wrote {train} / {valid} / {test} conversations (train / valid / test) to {}", a.out.display());
    println!("word vocabulary of {} words: {}", w.words, w.tokenizer.display());
    Ok(())
}

/// Scores predictions against references, line by line, and prints the means.
pub(crate) fn score(a: ScoreArgs) -> Result<()> {
    use lethe::textmetrics;
    if let Some(path) = &a.csv {
        lethe::output::check(
            "--csv",
            path,
            &[&a.predictions, &a.references, a.wordnet.as_deref().unwrap_or(&a.predictions)],
        )?;
    }
    let scorer = scorer(a.wordnet.as_deref())?;
    let scores = textmetrics::score_files(&a.predictions, &a.references, &scorer)?;
    if let Some(path) = &a.csv {
        lethe::output::write("--csv", path, &textmetrics::csv(&scores)?, &[])?;
    }
    let mean = textmetrics::mean(&scores).context("no pairs to score")?;
    println!("{}", textmetrics::summary(&mean, scores.len(), scorer.wordnet().is_some()));
    Ok(())
}

/// The text scorer: METEOR with WordNet's synonyms when given its folder.
pub(crate) fn scorer(wordnet: Option<&std::path::Path>) -> Result<lethe::textmetrics::Scorer> {
    use lethe::textmetrics::Scorer;
    Ok(match wordnet {
        Some(dir) => Scorer::with_wordnet(lethe::wordnet::WordNet::open(dir).context("--wordnet")?),
        None => Scorer::default(),
    })
}
