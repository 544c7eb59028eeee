//! Command-line definitions (clap) and their translation into a validated [`Config`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use lethe::config::{Config, Mechanism, Source, PRESETS};
use lethe::error::Result;

/// lethe: train, evaluate and run transformers with long memory.
#[derive(Parser, Debug)]
#[command(name = "lethe", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a model (default: the copy-tiny preset, a synthetic task that needs no download).
    Train(TrainArgs),
    /// Score a checkpoint on a split, streaming with the memory carried.
    Eval(EvalArgs),
    /// Continue a prompt token by token with the memory carried (constant memory).
    Generate(GenerateArgs),
    /// Build a tokenizer from text files: a word vocabulary (`words`) or a byte-level
    /// BPE (`bpe`), written as DIR/tokenizer.json for data.tokenizer = DIR.
    #[command(subcommand)]
    Tokenizer(TokenizerCommand),
    /// Time training steps: median step time, tokens/s, peak memory.
    Bench(BenchArgs),
    /// Train each mechanism at several memory sizes on one task, then write a table and a
    /// plot of quality against memory size (paper Figures 4 and 5).
    Sweep(SweepArgs),
    /// Pictures of what a model remembers.
    #[command(subcommand)]
    Inspect(InspectCommand),
    /// Training and validation curves of several runs on one figure (PNG and SVG).
    Plot(PlotArgs),
    /// Write a small generated data set in the CMU-DoG layout (document-grounded
    /// dialogues, one movie per conversation) with a word vocabulary, for the CPU.
    DialogueData(DialogueDataArgs),
    /// Reply to every turn of a dialogue split (after the first --min-history) and score
    /// the replies against what was said (F1, ROUGE-1, ROUGE-L, METEOR), with the
    /// perplexity of the true responses: one row of the ∞-former paper's Table 2.
    DialogueEval(DialogueEvalArgs),
    /// Talk with a dialogue model about a document: the document is read into memory,
    /// then each line on standard input gets a reply on standard output.
    Chat(ChatArgs),
    /// Score generated text against references, one pair per line of two files: unigram
    /// F1, ROUGE-1, ROUGE-L and METEOR, as the ∞-former paper's Table 2.
    Score(ScoreArgs),
    /// Play gridworld episodes (corridor, portal) and print them as text, step by step:
    /// a trained agent from --checkpoint, or an untrained one for --preset.
    Play(PlayArgs),
    /// Long-context evaluation as the field runs it: passkey retrieval, RULER's synthetic
    /// tasks and BABILong's reasoning by length and depth, each sample streamed through
    /// the model with its memory carried and the answer decoded greedily; writes
    /// DIR/longeval.csv, DIR/longeval.json and charts (a rerun resumes); --compare draws
    /// several runs side by side.
    Longeval(LongevalArgs),
    /// Write a trained Llama-family run (`model.arch = "llama"`) as a Hugging Face folder
    /// (config.json, model.safetensors, tokenizer.json) that `transformers`, `lethe
    /// generate --init-from` and `lethe eval --init-from` read.
    Export(ExportArgs),
    /// Check a distributed launch: join the process group torchrun describes, then
    /// all-reduce, broadcast and meet at a barrier with known values, and time them
    /// (`torchrun --nproc-per-node 2 --no-python lethe dist-check`).
    DistCheck(DistCheckArgs),
}

#[derive(Args, Debug)]
pub struct LongevalArgs {
    /// Checkpoint file, or a run folder holding checkpoint.safetensors.
    #[arg(long, required_unless_present = "init_from", conflicts_with = "init_from")]
    pub checkpoint: Option<PathBuf>,
    /// A pretrained Llama-family model's Hugging Face folder (with its tokenizer.json),
    /// read under each of --policies at each of --budgets, each into its own folder of
    /// --out, then drawn side by side with the --learned and --compare runs.
    #[arg(long, value_name = "FOLDER")]
    pub init_from: Option<PathBuf>,
    /// With --init-from: the key-value cache policies, comma-separated, as `lethe eval
    /// --policy` takes them (full, window, streaming, h2o, tova, snapkv, with settings
    /// as NAME:KEY=VALUE) [default: full].
    #[arg(long, value_delimiter = ',', value_name = "POLICIES")]
    pub policies: Option<Vec<String>>,
    /// With --policies other than full: the budgets, comma-separated, each entries a
    /// layer and key-value head (64) or a fraction of each sample's length (1/8).
    #[arg(long, value_delimiter = ',', value_name = "BUDGETS")]
    pub budgets: Option<Vec<String>>,
    /// With --init-from: the precision of the decoder's weights, activations and
    /// key-value cache (and of its --learned Expire-Span runs): f32, bf16 or f16
    /// (RMSNorm's statistics, RoPE's angles and the softmax in float32, as `transformers`
    /// computes them) [default: f32].
    #[arg(long, value_parser = precision_item)]
    pub precision: Option<lethe::config::train::Precision>,
    /// With --init-from: lethe runs of the folder's model with Expire-Span (read at
    /// every budget, its memories with the least remaining span deleted first, and once
    /// uncapped) or the ∞-former (read once, at the memory it was trained with, in blocks
    /// of its own train.block); comma-separated run folders or checkpoints.
    #[arg(long, value_delimiter = ',', value_name = "RUNS")]
    pub learned: Option<Vec<PathBuf>>,
    /// With --init-from: tokens read at a time under a budget (default 1: each token
    /// predicted from what the policy kept alone; the full cache reads blocks of 512).
    #[arg(long, allow_negative_numbers = true)]
    pub block: Option<usize>,
    /// Tasks, comma-separated: `all`, `niah` (RULER's eight needle tasks), `ruler`
    /// (those, vt, cwe and fwe), `babilong` (qa1-qa5), or task names: passkey,
    /// niah_single_1, niah_single_2, niah_single_3, niah_multikey_1, niah_multikey_2,
    /// niah_multikey_3, niah_multivalue, niah_multiquery, vt (variable tracking), cwe
    /// (common words), fwe (frequent words), qa1, qa2, qa3, qa4, qa5 (bAbI reasoning).
    #[arg(long, default_value = "all", value_parser = suite)]
    pub suite: Suite,
    /// Sample lengths in the model's units (bytes, or tokens for a model with a
    /// tokenizer), comma-separated; `k` is 1024.
    #[arg(long, default_value = "1k,2k,4k", value_parser = lengths)]
    pub lengths: Lengths,
    /// Depths of the asked needles in percent of the haystack, comma-separated (cwe,
    /// fwe and qa1-qa5 spread their facts over the whole context: one cell per length).
    #[arg(long, default_value = "0,25,50,75,100", value_parser = depths)]
    pub depths: Depths,
    /// Samples per task, length and depth.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4)]
    pub samples: usize,
    /// The haystack of the tasks whose haystack is text (RULER's essays: niah_single_2
    /// and _3, niah_multikey_1, niah_multivalue, niah_multiquery; BABILong's books:
    /// qa1-qa5): a text file, or `digits` (sentences of random four-digit groups) or
    /// `noise` (the repeated noise sentences, the default); a file of either name is
    /// given as ./digits or ./noise.
    #[arg(long, value_name = "FILE|digits|noise")]
    pub haystack: Option<PathBuf>,
    /// Seed of the samples.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub seed: u64,
    /// More runs to evaluate on the same grid, each into its own folder of --out, then
    /// drawn side by side: accuracy against length, one line per run
    /// (accuracy.svg, accuracy-TASK.svg, compare.csv).
    #[arg(long, value_name = "RUN", num_args = 1..)]
    pub compare: Vec<PathBuf>,
    /// Folder for longeval.csv and longeval.json, the heatmaps and accuracy.svg.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// `--suite`: the task names, in the suite's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Suite(pub Vec<&'static str>);

/// `--lengths`, in the model's units.
#[derive(Clone, Debug, PartialEq)]
pub struct Lengths(pub Vec<usize>);

/// `--depths`, as fractions in [0, 1].
#[derive(Clone, Debug, PartialEq)]
pub struct Depths(pub Vec<f64>);

fn suite(text: &str) -> std::result::Result<Suite, String> {
    let tasks = lethe::data::longctx::TASKS;
    let mut out: Vec<&'static str> = Vec::new();
    for item in text.split(',').map(str::trim) {
        let chosen: Vec<&'static str> = match item {
            "all" => tasks.to_vec(),
            "niah" => tasks.iter().copied().filter(|t| t.starts_with("niah")).collect(),
            "ruler" => tasks.iter().copied().filter(|t| *t != "passkey" && !t.starts_with("qa")).collect(),
            "babilong" => tasks.iter().copied().filter(|t| t.starts_with("qa")).collect(),
            name => match tasks.iter().find(|t| **t == name) {
                Some(t) => vec![*t],
                None => {
                    return Err(format!(
                        "unknown task `{name}`; known: all, niah, ruler, babilong, {}",
                        tasks.join(", ")
                    ))
                }
            },
        };
        out.extend(chosen.into_iter().filter(|t| !out.contains(t)).collect::<Vec<_>>());
    }
    Ok(Suite(out))
}

fn lengths(text: &str) -> std::result::Result<Lengths, String> {
    let one = |item: &str| {
        let (digits, scale) = match item.strip_suffix(['k', 'K']) {
            Some(d) => (d, 1024),
            None => (item, 1),
        };
        match digits.parse::<usize>() {
            Ok(n) if n > 0 => n.checked_mul(scale).ok_or_else(|| format!("length `{item}` is too large")),
            _ => Err(format!("length `{item}` is not a positive whole number (`k` is 1024: 4k)")),
        }
    };
    text.split(',').map(|i| one(i.trim())).collect::<std::result::Result<Vec<_>, _>>().map(Lengths)
}

fn depths(text: &str) -> std::result::Result<Depths, String> {
    let one = |item: &str| match item.parse::<f64>() {
        Ok(d) if (0.0..=100.0).contains(&d) => Ok(d / 100.0),
        _ => Err(format!("depth `{item}` is not a percentage from 0 to 100")),
    };
    text.split(',').map(|i| one(i.trim())).collect::<std::result::Result<Vec<_>, _>>().map(Depths)
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Checkpoint file, or a run folder holding checkpoint.safetensors.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The folder to write; it must not exist (written whole or not at all).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct DistCheckArgs {
    /// Floats per all-reduce.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1 << 20)]
    pub elements: usize,
    /// All-reduces to time (the median is reported).
    #[arg(long, allow_negative_numbers = true, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds the rendezvous and each collective wait for the other ranks before
    /// giving up with an error.
    #[arg(long, allow_negative_numbers = true, default_value_t = 60)]
    pub timeout: u64,
    /// The collectives to check: `gloo` on CPU tensors, or `nccl` on each rank's GPU
    /// (`cuda:LOCAL_RANK`; needs liblethe_nccl.so, which scripts/build-nccl.sh builds).
    #[arg(long, value_enum, default_value_t = CheckBackend::Gloo)]
    pub backend: CheckBackend,
}

/// `lethe dist-check --backend`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckBackend {
    /// c10d's Gloo, on CPU tensors.
    Gloo,
    /// c10d's NCCL, on each rank's GPU.
    Nccl,
}

#[derive(Args, Debug)]
pub struct PlayArgs {
    /// Checkpoint file, or a run folder holding checkpoint.safetensors (default: an
    /// untrained agent for the config given by --preset, --config and --set).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Episodes to play.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub episodes: usize,
    /// Print only each episode's last map and figures, not every step.
    #[arg(long)]
    pub summary: bool,
    /// Expire-Span agents: write the span of every step's memory, per layer, into this
    /// folder (agent-spans.svg, .png, .html, .csv) instead of printing the steps.
    #[arg(long, value_name = "DIR")]
    pub spans: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum InspectCommand {
    /// Shade every byte of a text by the span an Expire-Span model gives it, per layer
    /// (writes spans.svg, spans.png and spans.html).
    Spans(InspectSpansArgs),
    /// Show an ∞-former's long-term memory over a text: the attention over the memory
    /// per layer and the memory space each byte holds (writes ltm.svg, ltm.png and ltm.html).
    Ltm(InspectSpansArgs),
}

#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Run folders (each holds metrics.jsonl).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The field of metrics.jsonl to plot: loss, bpb, ppl, accuracy, lr, grad_norm, ...
    #[arg(long, default_value = "loss")]
    pub metric: String,
    /// The figure's path without extension: writes OUT.png and OUT.svg.
    #[arg(long, default_value = "curves")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct DialogueDataArgs {
    /// The folder to write (WikiData/, Conversations/{train,valid,test}/, tokenizer/).
    #[arg(long)]
    pub out: PathBuf,
    /// Conversations in all, split 0.8 / 0.05 / 0.15.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3000)]
    pub conversations: usize,
    /// Seed of the generated movies and conversations.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Args, Debug)]
pub struct DialogueEvalArgs {
    /// Checkpoint file, or a run folder holding checkpoint.safetensors, trained on dialogues.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// train, valid or test.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Another CMU-DoG folder than the one the model was trained on.
    #[arg(long)]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    pub reply: ReplyArgs,
    /// Turns read before the first reply of each conversation.
    #[arg(long, allow_negative_numbers = true, default_value_t = 2)]
    pub min_history: usize,
    /// Only the first N conversations of the split (0: all).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub conversations: usize,
    /// Write every reply with its reference and scores to this CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// WordNet's database folder (index.noun, data.noun, noun.exc, ...; Debian's
    /// wordnet-base installs /usr/share/wordnet): METEOR then matches synonyms too, as
    /// NLTK's. Without it METEOR has the exact and stem stages only.
    #[arg(long, value_name = "DIR")]
    pub wordnet: Option<PathBuf>,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Override a config field for this evaluation, e.g. `data.dialogue.document=false`.
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub overrides: Vec<String>,
}

/// How a dialogue model writes its replies (dialogue-eval, chat).
#[derive(Args, Debug)]
pub struct ReplyArgs {
    /// greedy, sample (--temperature, --top-k, --top-p) or beam (--beam).
    #[arg(long, default_value = "greedy")]
    pub decode: String,
    /// Hypotheses kept by beam search.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4)]
    pub beam: usize,
    /// Sampling temperature.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub temperature: f64,
    /// Sample only among the k most likely tokens (0: all).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold (the official evaluation's 0.9).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.9)]
    pub top_p: f64,
    /// Sampler seed.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub seed: u64,
    /// Most tokens in a reply (at most 4096).
    #[arg(long, allow_negative_numbers = true, default_value_t = 50)]
    pub max_length: usize,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Checkpoint file, or a run folder holding checkpoint.safetensors, trained on dialogues.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The document to talk about (text).
    #[arg(long)]
    pub document: PathBuf,
    #[command(flatten)]
    pub reply: ReplyArgs,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// Generated responses, one per line.
    pub predictions: PathBuf,
    /// Reference responses, one per line, in the same order.
    pub references: PathBuf,
    /// Also write every pair's scores (precision, recall and F of each ROUGE) to this CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// WordNet's database folder (index.noun, data.noun, noun.exc, ...; Debian's
    /// wordnet-base installs /usr/share/wordnet): METEOR then matches synonyms too, as
    /// NLTK's. Without it METEOR has the exact and stem stages only.
    #[arg(long, value_name = "DIR")]
    pub wordnet: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum TokenizerCommand {
    /// A word vocabulary (the ∞-former paper's appendix D, Transformer-XL's Wikitext-103
    /// set-up): whitespace-separated words and <eos> at line ends, most frequent first;
    /// rare words read as <unk>.
    Words(WordsArgs),
    /// A byte-level BPE as GPT-2's, learned from the text.
    Bpe(BpeArgs),
}

/// Where a tokenizer is learned from and written to.
#[derive(Args, Debug)]
pub struct TokenizerOut {
    /// Text files to learn from (for Wikitext: wiki.train.tokens only).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Folder to write tokenizer.json into.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace a tokenizer.json already in --out.
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Args, Debug)]
pub struct WordsArgs {
    #[command(flatten)]
    pub io: TokenizerOut,
    /// Words seen fewer times than this read as <unk>.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub min_count: u64,
    /// Keep at most this many words, the most frequent (0: all).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub max_size: usize,
}

#[derive(Args, Debug)]
pub struct BpeArgs {
    #[command(flatten)]
    pub io: TokenizerOut,
    /// Token ids in all: the 256 byte symbols plus the merges learned.
    #[arg(long, allow_negative_numbers = true)]
    pub vocab: usize,
}

#[derive(Args, Debug)]
pub struct InspectSpansArgs {
    /// Checkpoint file, or a run folder holding checkpoint.safetensors.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A file holding the text to stream through the model.
    #[arg(long, required_unless_present = "conversation")]
    pub text: Option<PathBuf>,
    /// Instead of --text, conversation N (from 0) of the run's dialogue data as the model
    /// reads it: the document, then the turns (the ∞-former paper's Figure 5).
    #[arg(long, conflicts_with = "text")]
    pub conversation: Option<usize>,
    /// The split --conversation is taken from.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// inspect ltm: a second ∞-former run to draw beside the first, on the same text
    /// (e.g. without and with sticky memories).
    #[arg(long, value_name = "RUN")]
    pub compare: Option<PathBuf>,
    /// Folder for the pictures (spans.svg, .png and .html, or ltm.svg, .png and .html).
    #[arg(long, default_value = "inspect")]
    pub out: PathBuf,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Options that build a config: preset, file, overrides.
#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// Named preset to start from (also --list-presets). Default: copy-tiny.
    #[arg(long, short, value_parser = preset_names())]
    pub preset: Option<String>,
    /// TOML file merged over the preset.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Override any config field: --set model.layers=4 --set train.lr=3e-4 (repeatable).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub overrides: Vec<String>,
    /// Data file or folder (sets data.path; a folder also sets data.source = folder,
    /// a file sets data.source = file).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Start from trained parameters: a Hugging Face GPT-2 folder (config.json,
    /// model.safetensors, and its tokenizer), or a lethe run folder or checkpoint. The
    /// model's sizes become the source's; a memory it lacks starts fresh (train.init_from).
    #[arg(long, value_name = "DIR")]
    pub init_from: Option<PathBuf>,
    /// Number of optimiser steps (train.steps).
    #[arg(long, allow_negative_numbers = true)]
    pub steps: Option<usize>,
    /// Run name (the run folder is <out>/<name>).
    #[arg(long)]
    pub name: Option<String>,
    /// Seed for initialisation, data and dropout.
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// cpu, cuda, cuda:N or auto (train.device).
    #[arg(long)]
    pub device: Option<String>,
    /// Task length, in the task's unit: copy, most `A`s per run; collision, steps per
    /// simulation; instruction, most instructions per episode; sorting, symbols to sort;
    /// corridor, longest corridor; portal, rooms.
    #[arg(long, allow_negative_numbers = true)]
    pub length: Option<usize>,
    /// Task distance, `N` or `MIN-MAX`: copy, filler tokens; instruction, distractor words;
    /// corridor, corridor lengths.
    #[arg(long, allow_negative_numbers = true, value_name = "MIN-MAX", value_parser = parse_range)]
    pub distance: Option<(usize, usize)>,
    /// Seed of the generated data and the stream order alone (data.seed; default: --seed).
    #[arg(long, allow_negative_numbers = true)]
    pub data_seed: Option<u64>,
    /// List the presets and exit.
    #[arg(long)]
    pub list_presets: bool,
    /// Print the resolved config as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Print every config key that `--set` takes (or those under PREFIX, e.g.
    /// `memory.expire`) with its default and meaning, and exit.
    #[arg(long, value_name = "PREFIX", num_args = 0..=1, default_missing_value = "")]
    pub help_config: Option<String>,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Parent folder of run folders.
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Continue the run in <out>/<name> from its checkpoint.
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: bool,
    /// Start over even when <out>/<name> holds a checkpoint.
    #[arg(long)]
    pub overwrite: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
    /// Stop after this step with a checkpoint, as if interrupted (continue with --resume).
    #[arg(long, allow_negative_numbers = true)]
    pub stop_after: Option<usize>,
    /// Evaluate never, not even at the end: a smoke run of a large preset
    /// (`--steps 1 --no-eval`) takes one step and writes its checkpoint.
    #[arg(long)]
    pub no_eval: bool,
    /// With --resume: continue under changed optimisation settings (train.lr, the
    /// schedule, the optimiser), which --resume otherwise refuses.
    #[arg(long, requires = "resume")]
    pub accept_changes: bool,
}

/// What a pretrained decoder's key-value cache keeps (`generate` and `eval` with
/// --init-from).
#[derive(Args, Debug)]
pub struct KvCacheArgs {
    /// With --init-from: what the key-value cache keeps, full, window, streaming, h2o,
    /// tova or snapkv, with settings as NAME:KEY=VALUE,... (e.g. streaming:sinks=4,
    /// snapkv:window=64,kernel=5).
    #[arg(long, value_name = "NAME", default_value = "full")]
    pub policy: String,
    /// With --policy other than full: the entries each layer keeps per key-value head
    /// (1024), or a fraction of the context, the prompt and the tokens generated or the
    /// tokens scored (0.25 or 1/4).
    #[arg(long, value_name = "ENTRIES", allow_negative_numbers = true)]
    pub budget: Option<String>,
}

impl KvCacheArgs {
    /// Whether a policy or a budget was asked for.
    pub fn given(&self) -> bool {
        self.policy != "full" || self.budget.is_some()
    }
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Checkpoint file, or a run folder holding checkpoint.safetensors.
    #[arg(long, required_unless_present = "init_from", conflicts_with = "init_from")]
    pub checkpoint: Option<PathBuf>,
    /// A pretrained Llama-family model's Hugging Face folder: its perplexity on the text
    /// --data FILE (one stream, through the folder's tokenizer.json), its key-value
    /// cache kept by --policy.
    #[arg(long, value_name = "FOLDER")]
    pub init_from: Option<PathBuf>,
    #[command(flatten)]
    pub kv: KvCacheArgs,
    /// With --init-from: the precision of the decoder's weights, activations and
    /// key-value cache (and of its --learned Expire-Span runs): f32, bf16 or f16
    /// (RMSNorm's statistics, RoPE's angles and the softmax in float32, as `transformers`
    /// computes them) [default: f32].
    #[arg(long, value_parser = precision_item)]
    pub precision: Option<lethe::config::train::Precision>,
    /// train, valid or test [default: valid].
    #[arg(long)]
    pub split: Option<String>,
    /// Block length at evaluation (default: the training block length; with --init-from,
    /// 512 for the full cache and 1 under a policy, so that every token is predicted
    /// from the budget's entries alone).
    #[arg(long, allow_negative_numbers = true)]
    pub block: Option<usize>,
    /// Parallel streams (default: the training batch).
    #[arg(long, allow_negative_numbers = true)]
    pub batch: Option<usize>,
    /// Stop after this many tokens (default: the whole split).
    #[arg(long, allow_negative_numbers = true)]
    pub max_tokens: Option<usize>,
    /// Score the text --data FILE in consecutive windows of N tokens, each read from an
    /// empty cache (with --init-from, a --budget fraction being a share of N; with
    /// --checkpoint, from an empty memory in blocks of --block, default the training
    /// block) (default with --init-from: the whole text as one window).
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    pub context: Option<usize>,
    /// With --init-from: score the text under each of these key-value cache policies
    /// (comma-separated, as --policy takes them) at each of --budgets, and write
    /// OUT/budget.csv, OUT/budget.md and a chart of perplexity against the budget.
    #[arg(long, value_delimiter = ',', value_name = "POLICIES", requires_all = ["budgets", "out"])]
    pub policies: Option<Vec<String>>,
    /// With --policies: the budgets, comma-separated, as --budget takes them (1/2,1/4,256).
    #[arg(long, value_delimiter = ',', value_name = "BUDGETS", requires = "policies")]
    pub budgets: Option<Vec<String>>,
    /// With --policies: the folder for budget.csv, budget.md, budget.svg and budget.png.
    #[arg(long, value_name = "DIR", requires = "policies")]
    pub out: Option<PathBuf>,
    /// With --policies: lethe runs of the folder's model with Expire-Span or the
    /// ∞-former (comma-separated run folders or checkpoints). An Expire-Span run is
    /// scored at every budget with memory.expire.budget set to it (the memories with the
    /// least remaining span deleted first) and once uncapped, token by token unless
    /// --block says otherwise; an ∞-former once, at the memory it was trained with, in
    /// blocks of its own train.block (its long-term memory absorbs whole blocks).
    #[arg(long, value_delimiter = ',', value_name = "RUNS", requires = "policies")]
    pub learned: Option<Vec<PathBuf>>,
    /// Read the data from here instead of the path saved in the checkpoint.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write every target's loss (and its span and the memory size per layer) as
    /// CSV to this file, to compare two models token by token (Expire-Span Fig. 9).
    #[arg(long, value_name = "FILE")]
    pub per_token: Option<PathBuf>,
    /// Expire-Span only: cap every predicted span at this many tokens (paper Fig. 9).
    #[arg(long, allow_negative_numbers = true)]
    pub max_span: Option<usize>,
    /// Gridworld checkpoints: episodes to play (default: the config's rl.eval_episodes).
    #[arg(long, allow_negative_numbers = true)]
    pub episodes: Option<usize>,
    /// Override a field of the checkpoint's config for this evaluation, e.g.
    /// --set memory.expire.deletion=batch (repeatable; the parameters must still fit).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub overrides: Vec<String>,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Checkpoint file, or a run folder holding checkpoint.safetensors.
    #[arg(long, required_unless_present = "init_from", conflicts_with = "init_from")]
    pub checkpoint: Option<PathBuf>,
    /// A pretrained Llama-family model's Hugging Face folder (config.json, its weights,
    /// tokenizer.json) to generate from as it is, its key-value cache kept by --policy.
    #[arg(long, value_name = "FOLDER")]
    pub init_from: Option<PathBuf>,
    #[command(flatten)]
    pub kv: KvCacheArgs,
    /// The precision of the decoder's weights, activations and key-value cache: f32,
    /// bf16 or f16 (RMSNorm's statistics, RoPE's angles and the softmax in float32, as
    /// `transformers` computes them) [default: f32]. With --init-from, or --checkpoint of
    /// Expire-Span on a Llama-family model.
    #[arg(long, value_parser = precision_item)]
    pub precision: Option<lethe::config::train::Precision>,
    /// The text to continue.
    #[arg(long, conflicts_with_all = ["prompt_file", "prompt_ids"])]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt_file: Option<PathBuf>,
    /// The prompt as token ids, e.g. 1,2,3 (bytes for a byte model), to compare the
    /// tokens with other tools'.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Print the generated token ids, comma-separated, instead of the text.
    #[arg(long)]
    pub print_ids: bool,
    /// Bytes to generate; tokens for a model with a tokenizer (--tokens is the same flag).
    #[arg(long, alias = "tokens", allow_negative_numbers = true, default_value_t = 200)]
    pub bytes: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub temperature: f64,
    /// Sample only among the k most likely tokens (0: all).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: only among the most likely tokens that make up this much
    /// probability (1: all).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub top_p: f64,
    /// Sampler seed.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub seed: u64,
    /// Expire-Span only: cap every predicted span at this many tokens.
    #[arg(long, allow_negative_numbers = true)]
    pub max_span: Option<usize>,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Timed steps (per round).
    #[arg(long = "bench-steps", allow_negative_numbers = true, default_value_t = 20)]
    pub bench_steps: usize,
    /// Time the configs in this many rounds of --bench-steps steps each, taking turns
    /// (every config is built and warmed up first, so all are held in memory at once):
    /// on a machine whose speed drifts, they are slowed alike. Each config's figures are
    /// over all its rounds, with the median over the rounds of its time relative to the
    /// first config's ("vs first"); the peak memory is not reported.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub rounds: usize,
    /// Untimed warm-up steps.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3)]
    pub warmup: usize,
    /// Tokens per stream to stream through the model (forward only) before timing, e.g.
    /// 8192, 65536 or 1048576 (default: enough to fill the memory).
    #[arg(long, allow_negative_numbers = true, value_name = "TOKENS")]
    pub context: Option<usize>,
    /// After the timed steps, run as many again with each phase of the step timed
    /// (forward, backward, optimiser, and inside the forward pass each layer's
    /// attention, memory and feed-forward), and print the time per phase. With
    /// --rounds, every round profiles after timing, so the profiles are in turns too.
    #[arg(long)]
    pub profile: bool,
    /// With --profile (which it implies): record the profiled steps with libtorch's
    /// profiler, every operation of the forward and backward passes, as a Chrome trace
    /// <out>/<name>/trace-<config>.json (chrome://tracing, ui.perfetto.dev;
    /// scripts/trace-summary.py sums it per operation). At most 50 --bench-steps: the
    /// profiler holds every event in memory, about 30 MB a step at enwik8-tiny. Not
    /// with --rounds.
    #[arg(long)]
    pub trace: bool,
    /// Time the steps on the config's training data (--data, or the preset's), read as
    /// `lethe train` reads it, instead of random tokens: what a learned memory keeps
    /// (Expire-Span's spans, Adaptive-Span's) depends on what it reads, and on random
    /// tokens, where there is nothing to remember, training shrinks the spans while they
    /// are timed.
    #[arg(long)]
    pub train_data: bool,
    /// Leave the parameters as they are: each timed step computes everything a training
    /// step does, the optimiser's update included, at a learning rate of 0, so that a
    /// learned memory keeps its size while the configs are timed (with --init-from a
    /// trained run: the size it learned).
    #[arg(long)]
    pub frozen: bool,
    /// A mechanism to bench, optionally with its memory size as in `lethe sweep`:
    /// `fixed`, `expire:1024`, `infinity:512` (repeatable). Default: the config's own.
    #[arg(long = "mechanism", value_name = "MECH[:SIZE]", value_parser = mechanism_item)]
    pub mechanisms: Vec<String>,
    /// The training arithmetic of each config, comma-separated: `f32,bf16` times every
    /// config in float32 and under bfloat16 autocast, in turns. Default: the config's
    /// own (train.precision). With --init-from a Llama-family folder: the decoder's
    /// precisions, each --kv policy timed in each, in turns (a --learned Expire-Span run
    /// in the first) [default: f32].
    #[arg(long = "precision", value_delimiter = ',', value_name = "P1,P2", value_parser = precision_item)]
    pub precisions: Vec<lethe::config::train::Precision>,
    /// Sweep one knob and report how time and memory grow: `span=256,512,1024`,
    /// `context=8192,65536`, `block=32,64` or `batch=8,16`.
    #[arg(long, value_name = "KNOB=V1,V2,...")]
    pub scale: Option<String>,
    /// Parent folder: bench.json and bench.csv go to <out>/<name>.
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// With --init-from a Llama-family folder: a key-value cache policy to time,
    /// NAME[:KEY=VALUE,...][@BUDGET], e.g. full, h2o@1024, snapkv:window=32@1/8
    /// (repeatable; default full).
    #[arg(long = "kv", value_name = "POLICY[@BUDGET]")]
    pub kv: Vec<String>,
    /// With --init-from a Llama-family folder: prompt lengths in tokens before decoding,
    /// e.g. 1k,4k,16k [default: 1k].
    #[arg(long, value_name = "TOKENS", value_parser = lengths)]
    pub contexts: Option<Lengths>,
    /// With --init-from a Llama-family folder: tokens decoded after each prompt.
    #[arg(long, allow_negative_numbers = true, default_value_t = 32)]
    pub decode_tokens: usize,
    /// With --init-from a Llama-family folder: a lethe run of its model with Expire-Span
    /// (capped at BUDGET entries a layer when given, as --kv takes budgets) or the
    /// ∞-former, timed in turns with the policies: its prompt read as `lethe eval
    /// --learned` reads one (Expire-Span token by token, an ∞-former in blocks of its own
    /// train.block), then decoded token by token (repeatable).
    #[arg(long, value_name = "RUN[@BUDGET]")]
    pub learned: Vec<String>,
}

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// A mechanism to train, optionally with its own sizes: `fixed:8,16,32`, `expire:64`
    /// (repeatable). Default: every mechanism at --sizes.
    #[arg(long = "mechanism", value_name = "MECH[:SIZES]", value_parser = mechanism_item)]
    pub mechanisms: Vec<String>,
    /// Memory sizes for mechanisms given without their own, e.g. 16,32,64 (default:
    /// L/8, L/4, L/2 and L of the config, at least one block, less those a mechanism
    /// cannot be built with: a compressive or ∞-former memory needs more than a block).
    #[arg(long, allow_negative_numbers = true)]
    pub sizes: Option<String>,
    /// Seeds, e.g. 1,2,3 (default: the config's seed).
    #[arg(long, allow_negative_numbers = true)]
    pub seeds: Option<String>,
    /// Parent folder: the sweep is written to <out>/<name>-sweep.
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Retrain the sweep's runs that an earlier sweep into the same folder trained with
    /// other settings (without it such a sweep refuses before training anything; runs
    /// finished with the same settings are always kept).
    #[arg(long)]
    pub overwrite: bool,
}

impl ConfigArgs {
    /// Preset, then file, then overrides and flags; validated.
    pub fn resolve(&self) -> Result<Config> {
        self.resolve_over(Config::preset(self.preset.as_deref().unwrap_or("copy-tiny"))?, true)
    }

    /// Like [`ConfigArgs::resolve`], but for `--resume` without `--preset` or `--config`
    /// it starts from the config saved in the run folder `<out>/<name>`.
    pub fn resolve_for_resume(&self, out: &std::path::Path) -> Result<Config> {
        if self.preset.is_some() || self.config.is_some() {
            return self.resolve();
        }
        let name = self.name.as_deref().unwrap_or("copy-tiny");
        let path = out.join(name).join("config.toml");
        if !path.is_file() {
            let why = format!(
                "no run to resume in `{}` (it has no config.toml): train without --resume to start it",
                out.join(name).display()
            );
            return Err(lethe::LetheError::Invalid(why));
        }
        let text = lethe::input::read_to_string(&path)
            .map_err(|e| lethe::LetheError::ConfigParse(format!("`{}`: {e}", path.display())))?;
        // The saved config has adopted its init source's sizes already, and the run's
        // parameters are in its checkpoint: the source is not read again.
        self.resolve_over(Config::from_toml(&text, &path.display().to_string())?, false)
    }

    /// The config of a trained checkpoint with this command's overrides, `--seed`,
    /// `--data-seed`, `--device`, `--length` and `--distance` applied; the flags that
    /// would replace its model or name another run (`--preset`, `--config`, `--data`,
    /// `--init-from`, `--steps`, `--name`) are refused, not ignored.
    pub fn resolve_over_checkpoint(&self, checkpoint: Config) -> Result<Config> {
        let refused = [
            ("--preset", self.preset.is_some()),
            ("--config", self.config.is_some()),
            ("--data", self.data.is_some()),
            ("--init-from", self.init_from.is_some()),
            ("--steps", self.steps.is_some()),
            ("--name", self.name.is_some()),
        ];
        if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
            return Err(lethe::LetheError::Invalid(format!(
                "{flag}: with --checkpoint the model and its config are the checkpoint's (change a field with --set)"
            )));
        }
        self.resolve_over(checkpoint, false)
    }

    fn resolve_over(&self, base: Config, adopt_init: bool) -> Result<Config> {
        // A config is TOML, whose integers end at 2^63 - 1: larger counts are refused by
        // the flag's name, not as a failure to write the config.
        let most = i64::MAX as u64;
        let counts = [
            ("--steps", self.steps.map(|n| n as u64)),
            ("--seed", self.seed),
            ("--data-seed", self.data_seed),
            ("--length", self.length.map(|n| n as u64)),
            ("--distance", self.distance.map(|(_, max)| max as u64)),
        ];
        if let Some((flag, Some(n))) = counts.iter().find(|(_, n)| n.is_some_and(|n| n > most)) {
            return Err(lethe::LetheError::Invalid(format!("{flag} {n}: at most {most} (2^63 - 1)")));
        }
        let mut cfg = base;
        if let Some(file) = &self.config {
            cfg = cfg.merge_file(file)?;
        }
        cfg = cfg.apply_overrides(&self.overrides)?;
        if let Some(path) = &self.data {
            cfg.data.source = Source::for_path(path);
            let before = cfg.data.path.replace(path.clone());
            follow_tokenizer(&mut cfg, before.as_deref(), path);
        }
        if let Some(steps) = self.steps {
            cfg.train.steps = steps;
        }
        if let Some(name) = &self.name {
            cfg.name = name.clone();
        }
        if let Some(seed) = self.seed {
            cfg.seed = seed;
        }
        if let Some(device) = &self.device {
            cfg.train.device = device.clone();
        }
        if let Some(seed) = self.data_seed {
            cfg.data.seed = seed;
        }
        lethe::task::apply_options(&mut cfg, self.length, self.distance)?;
        if let Some(from) = self.init_from.clone().or(cfg.train.init_from.clone()).filter(|_| adopt_init) {
            let own = cfg.data.tokenizer.is_some();
            lethe::model::init::adopt(&mut cfg, &from)?;
            refuse_tokens_on_a_task(&cfg, &from, own)?;
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

/// A tokenizer kept inside the data folder the config named (`data/dialogue/tokenizer`)
/// is that folder's own: when `--data` names another folder that holds one in the same
/// place (`lethe dialogue-data --out DIR` writes `DIR/tokenizer`), that one is read.
fn follow_tokenizer(cfg: &mut Config, before: Option<&std::path::Path>, data: &std::path::Path) {
    let (Some(before), Some(tokenizer)) = (before, &cfg.data.tokenizer) else { return };
    let Ok(inside) = tokenizer.strip_prefix(before) else { return };
    let moved = data.join(inside);
    if !inside.as_os_str().is_empty() && moved.is_dir() {
        cfg.data.tokenizer = Some(moved);
    }
}

/// Refuses a model adopted from `from` that reads text through a tokenizer (one the
/// config did not name itself: `named`) for a task with symbols of its own: the user
/// left out `--data`, and the config check would name a setting they never gave.
fn refuse_tokens_on_a_task(cfg: &Config, from: &std::path::Path, named: bool) -> lethe::Result<()> {
    let text = cfg.data.source.reads_text() || cfg.data.source == Source::Longctx;
    match (&cfg.data.tokenizer, named || text) {
        (Some(tokenizer), false) => Err(lethe::LetheError::Invalid(format!(
            "--init-from `{}`: its model reads text through the tokenizer in `{}`, and data.source is `{}`, a task with symbols of its own: give --data FILE (or a preset of text)",
            from.display(),
            tokenizer.display(),
            cfg.data.source
        ))),
        _ => Ok(()),
    }
}

/// `N` or `MIN-MAX`, for --distance.
fn parse_range(text: &str) -> std::result::Result<(usize, usize), String> {
    let number = |s: &str| s.trim().parse::<usize>().map_err(|_| format!("`{s}` is not a whole number"));
    match text.split_once('-') {
        Some((lo, hi)) => Ok((number(lo)?, number(hi)?)),
        None => number(text).map(|n| (n, n)),
    }
}

/// The `--preset` values with their one-line descriptions, from [`PRESETS`]: `--help`
/// lists them, and clap refuses any other name with the list.
fn preset_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        PRESETS.iter().map(|p| clap::builder::PossibleValue::new(p.name).help(p.about)),
    )
}

/// A `--precision` item: `f32` or `bf16`.
fn precision_item(item: &str) -> std::result::Result<lethe::config::train::Precision, String> {
    lethe::config::train::Precision::parse(item)
}

/// A `--mechanism MECH[:SIZES]` item whose mechanism lethe knows (the sizes are read by
/// the command); the error lists the mechanisms.
fn mechanism_item(item: &str) -> std::result::Result<String, String> {
    let name = item.split_once(':').map_or(item, |(name, _)| name);
    Mechanism::parse(name.trim()).map(|_| item.to_string()).map_err(|e| e.to_string())
}
