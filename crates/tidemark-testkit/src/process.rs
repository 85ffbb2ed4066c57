//! Tidemark's own processes, started from the binary under test.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A free TCP port on 127.0.0.1 (free when asked; bind soon after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

/// A running `tidemark` role. Killed (SIGKILL) on drop.
pub struct TidemarkProcess {
    child: Option<Child>,
    /// `127.0.0.1:PORT` of its HTTP API (the first address it prints: the filer's, or the
    /// admin's for `tidemark admin`).
    pub addr: String,
    /// The admin's address, for `tidemark server` (which prints it second).
    pub admin_addr: String,
    /// The S3 gateway's address, for `tidemark server` (which prints it third), unless it was
    /// started with `--s3-addr off`.
    pub s3_addr: String,
    pub data_dir: PathBuf,
    stderr_log: PathBuf,
}

impl TidemarkProcess {
    /// Starts `tidemark server --data-dir DIR --filer-addr 127.0.0.1:0 EXTRA...` (the admin and
    /// the S3 gateway on free ports too, unless EXTRA says otherwise) and waits until it prints
    /// the addresses it listens on.
    pub fn server(bin: &Path, data_dir: &Path, extra: &[&str]) -> Self {
        Self::server_with_env(bin, data_dir, extra, &[])
    }

    /// [`TidemarkProcess::server`], with variables added to its environment.
    pub fn server_with_env(bin: &Path, data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut args = vec![
            "server",
            "--data-dir",
            data_dir.to_str().expect("UTF-8 temp path"),
            "--filer-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ];
        let s3_set = extra.iter().position(|a| *a == "--s3-addr");
        if s3_set.is_none() {
            args.extend_from_slice(&["--s3-addr", "127.0.0.1:0"]);
        }
        let s3_off = s3_set.and_then(|i| extra.get(i + 1)).is_some_and(|v| v.eq_ignore_ascii_case("off"));
        args.extend_from_slice(extra);
        Self::start_with_env(bin, data_dir, &args, if s3_off { 2 } else { 3 }, env)
    }

    /// Starts one filer of a cluster in `dir`: `tidemark filer` on the shared `store` (a
    /// PostgreSQL URL), its content on `blob_store` (an `s3://` URL on moto, reached with
    /// moto's credentials), on a free port.
    pub fn cluster_filer(bin: &Path, dir: &Path, store: &str, blob_store: &str) -> Self {
        let d = dir.to_str().expect("UTF-8 temp path");
        let args = ["filer", "--data-dir", d, "--addr", "127.0.0.1:0", "--store", store, "--blob-store", blob_store];
        let aws = [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")];
        Self::start_with_env(bin, dir, &args, 1, &aws)
    }

    /// Starts `tidemark ARGS...`, which must print `... listening on http://ADDR ...` on stdout.
    pub fn start(bin: &Path, data_dir: &Path, args: &[&str]) -> Self {
        Self::start_with(bin, data_dir, args, 1)
    }

    /// Starts a process that prints `listening on` for `listeners` addresses.
    pub fn start_with(bin: &Path, data_dir: &Path, args: &[&str], listeners: usize) -> Self {
        Self::start_with_env(bin, data_dir, args, listeners, &[])
    }

    /// [`TidemarkProcess::start_with`], with variables added to its environment (credentials
    /// of the standard AWS chain, failpoints).
    pub fn start_with_env(bin: &Path, data_dir: &Path, args: &[&str], listeners: usize, env: &[(&str, &str)]) -> Self {
        let stderr_log = data_dir.with_extension("stderr.log");
        let log = std::fs::File::create(&stderr_log).expect("creating the stderr log");
        let mut child = Command::new(bin)
            .args(args)
            .envs(env.iter().copied())
            .env_remove("RUST_LOG") // the product's default filter, as a user runs it
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // http:// or, with TLS, https:// (the address without the scheme either way).
                let rest =
                    line.split("listening on http://").nth(1).or_else(|| line.split("listening on https://").nth(1));
                if let Some(rest) = rest {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
                }
            }
        });
        let mut p = TidemarkProcess {
            child: Some(child),
            addr: String::new(),
            admin_addr: String::new(),
            s3_addr: String::new(),
            data_dir: data_dir.to_path_buf(),
            stderr_log,
        };
        for i in 0..listeners {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(addr) if i == 0 => p.addr = addr,
                Ok(addr) if i == 1 => p.admin_addr = addr,
                Ok(addr) => p.s3_addr = addr,
                Err(_) => panic!("tidemark {args:?} did not start within 30 s; stderr:\n{}", p.stderr()),
            }
        }
        p
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, ...).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args([&format!("-{name}"), &self.pid().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{name} {}", self.pid());
        if name == "STOP" {
            // Sent is not stopped: a thread running on another core answers what it holds
            // first (a test then saw a stopped filer answer in 2 ms). Stopped is state `T`, in
            // every thread.
            let tasks = format!("/proc/{}/task", self.pid());
            let is_t = |stat: String| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'));
            let stopped = || {
                std::fs::read_dir(&tasks)
                    .is_ok_and(|d| d.flatten().all(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(is_t)))
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !stopped() {
                assert!(std::time::Instant::now() < deadline, "pid {} never stopped", self.pid());
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// Starts a process that prints nothing to wait for (a worker): waits until `ready` holds
    /// of its stderr log.
    pub fn start_quiet(bin: &Path, log_path: &Path, args: &[&str], ready: impl Fn(&str) -> bool) -> Self {
        let log = std::fs::File::create(log_path).expect("creating the stderr log");
        let child = Command::new(bin)
            .args(args)
            .env_remove("RUST_LOG") // the product's default filter, as a user runs it
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let p = TidemarkProcess {
            child: Some(child),
            addr: String::new(),
            admin_addr: String::new(),
            s3_addr: String::new(),
            data_dir: log_path.to_path_buf(),
            stderr_log: log_path.to_path_buf(),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !ready(&p.stderr()) {
            assert!(
                std::time::Instant::now() < deadline,
                "tidemark {args:?} not ready within 30 s; stderr:\n{}",
                p.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGKILL: no chance to clean up, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit by itself (after a signal sent elsewhere).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        let c = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = c.try_wait() {
                self.child = None;
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TidemarkProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `tidemark shell --filer ADDR -c COMMANDS` and returns its output.
pub fn run_shell(bin: &Path, addr: &str, commands: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(["shell", "--filer", addr, "-c", commands]).env_remove("TIDEMARK_TOKEN").stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap_or_else(|e| panic!("running the shell: {e}"))
}

/// The stdout of a command that must have succeeded (its stderr in the failure otherwise).
pub fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The stderr of a command that must have failed with exit status 1, and not by a panic.
pub fn fails(o: Output) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(o.status.code(), Some(1), "should fail: {}\n{stderr}", String::from_utf8_lossy(&o.stdout));
    stderr
}

/// Polls `check` until it holds; fails the test naming `what` after 40 s.
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// On a failing test (a panic), prints the tail of every `*.log` in a directory: the story of
/// the processes a test started there. Hold it for the test's length.
pub struct LogsOnFailure(pub std::path::PathBuf);

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for entry in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("--- {} (last 60 lines)", path.display());
                for l in &lines[lines.len().saturating_sub(60)..] {
                    eprintln!("{l}");
                }
            }
        }
    }
}
