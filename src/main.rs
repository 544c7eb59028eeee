//! The `lethe` binary: the command line ([`commands::main`] parses it, runs the command,
//! and turns errors into one line and a non-zero exit code). All logic lives in the library.

mod cli;
mod commands;

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(commands::main(std::env::args_os()))
}
