use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = bitpool::cli::Cli::parse();
    match bitpool::cli::execute(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bitpool: {error}");
            ExitCode::FAILURE
        }
    }
}
