//! The `bitpool` command: parses the command line and runs it (see [`bitpool::cli`]).

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

fn main() -> ExitCode {
    return_large_blocks_when_freed();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => {
            eprintln!("bitpool: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// A reconcile of a pool of 100,000 claims builds maps and vectors of several megabytes and
/// drops them. glibc raises its mmap threshold to the size of each large block freed, so after
/// the first such reconcile those blocks come from the heap, and their pages stay with the
/// process when freed (a restarted process's peak in a held run of 100,000 claims: 354 MiB, and
/// 252 with the thresholds fixed; BENCHMARKS.md, "Memory the allocator keeps"). Setting the two
/// thresholds fixes them at their defaults: large blocks are mapped, and returned when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_large_blocks_when_freed() {
    const DEFAULT_THRESHOLD: libc::c_int = 128 * 1024;
    // SAFETY: sets two of the allocator's parameters, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, DEFAULT_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, DEFAULT_THRESHOLD);
    }
}

/// Other C libraries (the image's musl) do not move their thresholds.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_large_blocks_when_freed() {}

async fn run() -> ExitCode {
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
