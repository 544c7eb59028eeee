//! The `lethe` binary: parse the command line, run, turn errors into one line and a
//! non-zero exit code. All logic lives in the library.

mod cli;
mod commands;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use cli::{Cli, Command, InspectCommand};
use commands::{bench, decoder, dialogue, inspect, longeval, plot, tokenizer, train};

fn main() -> ExitCode {
    let cli = Cli::parse();
    quiet_libtorch_panics();
    lethe::device::quiet_libtorch_log();
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli))) {
        Ok(outcome) => outcome,
        Err(payload) => match lethe::error::libtorch_failure(&panic_text(payload.as_ref())) {
            Some(said) => {
                eprintln!("error: {said}");
                return ExitCode::FAILURE;
            }
            None => std::panic::resume_unwind(payload),
        },
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            match e.downcast_ref::<lethe::LetheError>() {
                // 128 + SIGINT, as a shell reports a command stopped by Ctrl-C.
                Some(
                    lethe::LetheError::Interrupted { .. }
                    | lethe::LetheError::BenchInterrupted { .. }
                    | lethe::LetheError::BenchRoundsInterrupted { .. },
                ) => ExitCode::from(130),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// A libtorch error that a tensor operation on the main thread panicked with is said in
/// one line by `main` ([`lethe::error::libtorch_failure`]), not with the panic's message
/// and libtorch's C++ stack; every other panic keeps the default report.
fn quiet_libtorch_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let main_thread = std::thread::current().name() == Some("main");
        if !(main_thread && lethe::error::libtorch_failure(&panic_text(info.payload())).is_some()) {
            default(info);
        }
    }));
}

/// A panic's message, where it is text.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
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
fn quiet_on_closed_pipe() {
    // SAFETY: called once, before any thread is started; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
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
