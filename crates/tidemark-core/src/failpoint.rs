//! Failpoints: named places where a test can make the process die at once, as a SIGKILL would,
//! to check that what a crash between two steps leaves is safe (`TIDEMARK_FAILPOINTS=a,b`).
//! Off (one lookup of a cached empty list) unless that variable names the point.

use std::sync::OnceLock;

fn armed() -> &'static [String] {
    static ARMED: OnceLock<Vec<String>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var("TIDEMARK_FAILPOINTS")
            .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    })
}

/// Dies here, without unwinding or cleaning up, if `name` is armed.
pub fn hit(name: &str) {
    if armed().iter().any(|a| a == name) {
        eprintln!("failpoint {name}: dying here as if killed");
        std::process::abort();
    }
}
