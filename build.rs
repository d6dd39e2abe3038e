//! Names the build for `bitpool --version`, the User-Agent and the `bitpool_build_info` metric:
//! the release it is (`BITPOOL_VERSION`, which release builds set; else the package's version
//! marked `-dev`, for a build that is no release) and the commit it was built from
//! (`BITPOOL_COMMIT`, else the checkout's HEAD, else "unknown", as in a source tarball).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=BITPOOL_VERSION");
    println!("cargo:rerun-if-env-changed=BITPOOL_COMMIT");
    let version = non_empty_env("BITPOOL_VERSION").unwrap_or_else(|| {
        format!(
            "v{}-dev",
            std::env::var("CARGO_PKG_VERSION").unwrap_or_default()
        )
    });
    let commit = non_empty_env("BITPOOL_COMMIT")
        .or_else(head_commit)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=BITPOOL_BUILD_VERSION={version}");
    println!("cargo:rustc-env=BITPOOL_BUILD_COMMIT={commit}");
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// The checkout's HEAD, 12 hex digits. The build runs again when HEAD moves: only files that
/// exist are watched (cargo runs a build script every time for a watched file that is missing).
fn head_commit() -> Option<String> {
    let git_dir = Path::new(".git");
    if !git_dir.is_dir() {
        return None;
    }
    for watched in ["HEAD", "packed-refs"] {
        watch_if_present(&git_dir.join(watched));
    }
    if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD"))
        && let Some(reference) = head.trim().strip_prefix("ref: ")
    {
        watch_if_present(&git_dir.join(reference));
    }
    let output = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    let commit = String::from_utf8(output.stdout).ok()?;
    let commit = commit.trim();
    (output.status.success() && !commit.is_empty()).then(|| commit.to_owned())
}

fn watch_if_present(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
