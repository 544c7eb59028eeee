//! The commands, one file per group: each function takes its parsed arguments, calls the
//! library and prints. [`main`] parses the command line and dispatches to them.

pub(crate) mod bench;
pub(crate) mod decoder;
pub(crate) mod dialogue;
pub(crate) mod inspect;
pub(crate) mod learned;
pub(crate) mod longeval;
pub(crate) mod plot;
pub(crate) mod tokenizer;
pub(crate) mod train;

use anyhow::Result;
use clap::Parser;

use crate::cli::{Cli, Command, InspectCommand};

/// Runs the command line `args` (the program's name first): parses it, runs the command,
/// and turns errors into one line on stderr. Returns the exit status: 0, 1 for an error,
/// 2 for a command line clap refuses, 130 for a run stopped by Ctrl-C. The `lethe`
/// binary's `main`, and the `lethe` command of the Python package.
pub(crate) fn main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    quiet_libtorch_panics();
    lethe::device::quiet_libtorch_log();
    errors_past_the_file_size_limit();
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli))) {
        Ok(outcome) => outcome,
        Err(payload) => match failure_of(&panic_text(payload.as_ref())) {
            Some(said) => {
                lethe::say!("error: {said}");
                return 1;
            }
            None => std::panic::resume_unwind(payload),
        },
    };
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            lethe::say!("error: {e:#}");
            match e.downcast_ref::<lethe::LetheError>() {
                // 128 + SIGINT, as a shell reports a command stopped by Ctrl-C.
                Some(
                    lethe::LetheError::Interrupted { .. }
                    | lethe::LetheError::BenchInterrupted { .. }
                    | lethe::LetheError::BenchRoundsInterrupted { .. },
                ) => 130,
                _ => 1,
            }
        }
    }
}

/// A failure that the thread that runs the command panicked with ([`failure_of`]) is said
/// in one line by [`main`], not with the panic's message and libtorch's C++ stack; every
/// other panic keeps the default report.
fn quiet_libtorch_panics() {
    let runner = std::thread::current().id();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let on_runner = std::thread::current().id() == runner;
        if !(on_runner && failure_of(&panic_text(info.payload())).is_some()) {
            default(info);
        }
    }));
}

/// The one line a panic's message `text` comes down to where the panic is a failure of
/// the world, not a bug: a libtorch error a tensor operation panicked with
/// ([`lethe::error::libtorch_failure`]), or standard output that could not be written
/// (`println!` panics on a full disk). The panic unwinds as any error returns, so what
/// the command holds is cleaned up on the way.
fn failure_of(text: &str) -> Option<String> {
    lethe::error::libtorch_failure(text)
        .or_else(|| text.strip_prefix("failed printing to stdout: ").map(|why| format!("standard output: {why}")))
}

/// A failed write to standard output (a full disk), said as such: a bare I/O error names
/// no file.
pub(crate) fn stdout_failed(e: std::io::Error) -> lethe::LetheError {
    lethe::LetheError::Invalid(format!("standard output: {e}"))
}

/// A panic's message, where it is text.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn run(cli: Cli) -> Result<()> {
    // The launch this process is a rank of, when there are several ranks.
    let launch = lethe::dist::Launch::from_env()?.filter(|l| l.world_size > 1);
    if !matches!(cli.command, Command::Train(_) | Command::Bench(_) | Command::DistCheck(_)) {
        one_process(launch.as_ref())?;
    }
    let trains = matches!(&cli.command, Command::Train(a) if !a.config.list_presets && !a.config.print_config);
    // A rank of a launch keeps ignoring SIGPIPE too: Gloo writes to its peers' sockets,
    // and a write to a dead peer must come back as an error naming the rank, not kill
    // this process without a word.
    if !trains && launch.is_none() {
        quiet_on_closed_pipe();
    }
    match cli.command {
        Command::Train(a) => train::train(a),
        Command::Eval(a) => train::eval(a),
        Command::Generate(a) => train::generate(a),
        Command::Tokenizer(c) => tokenizer::tokenizer(c),
        Command::Plot(a) => plot::plot(a),
        Command::Score(a) => dialogue::score(a),
        Command::DialogueData(a) => dialogue::dialogue_data(a),
        Command::DialogueEval(a) => dialogue::dialogue_eval(a),
        Command::Chat(a) => dialogue::chat(a),
        Command::Bench(a) => bench::bench(a),
        Command::Sweep(a) => bench::sweep(a),
        Command::Inspect(InspectCommand::Spans(a)) => inspect::inspect_spans(a),
        Command::Inspect(InspectCommand::Ltm(a)) => inspect::inspect_ltm(a),
        Command::Play(a) => inspect::play(a),
        Command::Longeval(a) => longeval::longeval(a),
        Command::DistCheck(a) => bench::dist_check(a),
        Command::Export(a) => decoder::export(a),
    }
}

/// Lets a reader that stops early (`lethe eval … | head`) end the process quietly, as it
/// ends any Unix filter, instead of a panic on the next print. Rust ignores SIGPIPE;
/// this restores the default. Training keeps ignoring it: its progress lines go to
/// stderr and are dropped when nobody reads them, so the run and its checkpoints go on.
/// So does every rank of a distributed launch (`bench`, `dist-check`), whose sockets
/// to the other ranks would otherwise kill it silently when a peer dies.
pub(crate) fn quiet_on_closed_pipe() {
    // SAFETY: called once, before any thread is started; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Makes a write past the file-size limit (`ulimit -f`) fail with an error that names
/// the file, as a full disk does, instead of SIGXFSZ ending the process without a word.
/// Every file lethe writes goes to a temporary name first, so the one it replaces stays.
fn errors_past_the_file_size_limit() {
    // SAFETY: SIG_IGN is a valid disposition; no handler runs.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Refuses a multi-rank launch for the commands that run on one process (each rank
/// would repeat the work and write the same files).
fn one_process(launch: Option<&lethe::dist::Launch>) -> Result<()> {
    if let Some(l) = launch {
        anyhow::bail!("this command runs on one process (rank {} of {} here): start it without torchrun; `train` and `bench` run data-parallel", l.rank, l.world_size);
    }
    Ok(())
}
