//! `lethe tokenizer`: a word vocabulary or a byte-level BPE from text files.

use anyhow::Result;

use crate::cli::TokenizerCommand;

/// Learns a tokenizer from text files and writes it as `<out>/tokenizer.json`.
pub(crate) fn tokenizer(c: TokenizerCommand) -> Result<()> {
    use lethe::data::tokenizer::{Tokenizer, UNK};
    let io = match &c {
        TokenizerCommand::Words(a) => &a.io,
        TokenizerCommand::Bpe(a) => &a.io,
    };
    super::decoder::check_folder("--out", &io.out)?;
    let target = io.out.join("tokenizer.json");
    let inputs: Vec<&std::path::Path> = io.files.iter().map(|f| f.as_path()).collect();
    lethe::output::check("--out", &target, &inputs)?;
    if target.exists() && !io.overwrite {
        anyhow::bail!("`{}` already holds a tokenizer; pass --overwrite to replace it", target.display());
    }
    let mut texts = vec![];
    for file in &io.files {
        let bytes = lethe::input::read(file).map_err(|e| anyhow::anyhow!("`{}`: {e}", file.display()))?;
        lethe::say!("read `{}`: {:.1} MB", file.display(), bytes.len() as f64 / 1e6);
        texts.push(lethe::data::text::utf8(bytes, file)?);
    }
    if texts.iter().all(|t| t.trim().is_empty()) {
        anyhow::bail!("the text files hold no text to learn a tokenizer from");
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let megabytes = refs.iter().map(|t| t.len()).sum::<usize>() as f64 / 1e6;
    match &c {
        TokenizerCommand::Words(_) => lethe::say!("counting the words of {megabytes:.1} MB"),
        TokenizerCommand::Bpe(a) => lethe::say!("learning a BPE of {} ids from {megabytes:.1} MB", a.vocab),
    }
    let tokenizer = match &c {
        TokenizerCommand::Words(a) => Tokenizer::train_words(&refs, a.min_count, a.max_size)?,
        TokenizerCommand::Bpe(a) => Tokenizer::train_bpe(&refs, a.vocab)?,
    };
    // How the text reads through it.
    lethe::say!("reading the text through it");
    let (mut tokens, mut unknown) = (0usize, 0usize);
    let unk = tokenizer.encode(UNK)?.first().copied().filter(|_| tokenizer.spaced());
    for (text, file) in refs.iter().zip(&io.files) {
        let ids = lethe::data::text::encode_long(&tokenizer, text)
            .map_err(|e| anyhow::anyhow!("`{}`: {e}", file.display()))?;
        tokens += ids.len();
        unknown += unk.map_or(0, |u| ids.iter().filter(|&&i| i == u).count());
    }
    let made = super::decoder::make_folder("--out", &io.out)?;
    made.unless_failed(lethe::checkpoint::write_atomic(&target, tokenizer.to_json()?.as_bytes()))?;
    let bytes: usize = refs.iter().map(|t| t.len()).sum();
    let unknown = unk
        .map(|_| format!(", {:.2}% of them {UNK}", 100.0 * unknown as f64 / tokens.max(1) as f64))
        .unwrap_or_default();
    println!(
        "vocabulary of {} ids; the text reads as {tokens} tokens ({:.2} bytes each){unknown}; wrote {} (use it with --set data.tokenizer={} and model.vocab >= {})",
        tokenizer.vocab_size(),
        bytes as f64 / tokens.max(1) as f64,
        target.display(),
        io.out.display(),
        tokenizer.vocab_size()
    );
    Ok(())
}
