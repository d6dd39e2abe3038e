//! The control-plane script stops with a message naming what is missing, instead of failing
//! somewhere later.

mod support;

#[test]
fn a_missing_prerequisite_is_named() {
    let cache = support::root().join("target/test-logs/empty-cache");
    let _ = std::fs::remove_dir_all(&cache);
    // No etcd, no openssl, no apt-get to install them: only the shell and coreutils.
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
    assert!(
        stderr.contains("missing prerequisites:")
            && stderr.contains("etcd-server")
            && stderr.contains("openssl"),
        "{stderr}"
    );
    assert!(stderr.contains("no apt-get to install them"), "{stderr}");
}
