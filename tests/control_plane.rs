//! The control-plane script stops with a message naming what is missing, instead of failing
//! somewhere later.

mod support;

#[test]
fn a_missing_prerequisite_is_named() {
    let cache = support::root().join("target/test-logs/empty-cache");
    let _ = std::fs::remove_dir_all(&cache);
    // No Go, no openssl, no curl: only the shell (coreutils are not even on PATH).
    let output = std::process::Command::new("/bin/bash")
        .arg(support::root().join("hack/control-plane.sh"))
        .arg("build")
        .env_clear()
        .env("PATH", "/nonexistent")
        .env("HOME", "/nonexistent")
        .env("BITPOOL_CACHE_DIR", &cache)
        .output()
        .expect("run hack/control-plane.sh");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "it must stop: {stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(
        line.contains("missing prerequisite: Go 1.26 or newer")
            && line.contains("openssl")
            && line.contains("curl"),
        "one line naming what to install: {stderr}"
    );
}
