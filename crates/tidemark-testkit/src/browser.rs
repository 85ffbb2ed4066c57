//! Debian's headless Chromium, as the tests of web pages drive it (the Admin UI, a page on
//! another origin calling the S3 gateway).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Chromium's binary (`TIDEMARK_CHROMIUM`, else Debian's).
pub fn chromium() -> PathBuf {
    let p = std::env::var_os("TIDEMARK_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/chromium".into());
    assert!(p.exists(), "{} is missing: run ./scripts/setup.sh (it installs Debian's chromium)", p.display());
    p
}

/// Chromium with the flags this machine's closed network needs, and the profile `profile`.
pub fn browser(profile: &Path) -> Command {
    let mut c = Command::new(chromium());
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// The DOM of `url` once rendered (with `extra` flags, such as a virtual time budget for the
/// page's scripts).
pub fn dump_dom_with(profile: &Path, url: &str, extra: &[&str]) -> String {
    // Chromium now and then dies while starting on a loaded machine (a full-suite run: once in
    // several); a page that fails to render fails every attempt.
    let mut last = String::new();
    for _ in 0..3 {
        let out = browser(profile).args(extra).args(["--dump-dom", url]).output().expect("running chromium");
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
    }
    panic!("chromium --dump-dom {url} failed three times; the last said: {last}")
}
