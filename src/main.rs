use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

#[tokio::main]
async fn main() -> ExitCode {
    let mut command = bitpool::cli::Cli::command();
    // Run as a kubectl plugin, its usage says how the user called it.
    let program = std::env::args_os().next().map(std::path::PathBuf::from);
    if program.is_some_and(|p| p.file_name().is_some_and(|n| n == "kubectl-bitpool")) {
        command = command.bin_name("kubectl bitpool");
    }
    let cli = bitpool::cli::Cli::from_arg_matches(&command.get_matches())
        .unwrap_or_else(|error| error.exit());
    match bitpool::cli::execute(cli).await {
        Ok(bitpool::cli::Answer::Yes) => ExitCode::SUCCESS,
        Ok(bitpool::cli::Answer::No) => ExitCode::from(1),
        Err(error) => {
            eprintln!("bitpool: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
