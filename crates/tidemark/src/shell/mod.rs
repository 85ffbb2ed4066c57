//! `tidemark shell`: the operator's command line, in the reference's syntax (`fs.ls -l /docs`,
//! `remote.mount -dir=/mnt/data ...`). One-shot (`-c "CMD; CMD"`), scripted (commands on stdin)
//! or interactive (history, `help`, `help CMD`).

mod cache;
mod commands;
pub mod flags;
pub mod lex;
mod remote;
mod s3;
mod subscriptions;

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::pin::Pin;
use std::sync::Arc;

use tidemark_core::Filer;

use flags::{Args, FlagSpec};

/// What a command needs from the outside world.
pub struct Context {
    pub filer: Arc<dyn Filer>,
    /// The admin (`--admin`), asked for what only it knows: which worker runs which slice.
    pub admin: Option<AdminRef>,
    /// The filer over HTTP, when `filer` is one: a remote's secrets are read through it with
    /// the local cluster token when the filer keeps one (see [`Context::remote_conf`]).
    pub http: Option<tidemark_filer::client::HttpFiler>,
}

impl Context {
    /// Remote `name`'s configuration with its secrets whole, to open the remote: the shell
    /// talks to the bucket itself (listings, provisioning). A `tidemark server` without tokens
    /// shows every HTTP client masked secrets; the shell of the user who owns its data
    /// directory reads them with the cluster token kept there. Masked secrets are refused here
    /// with what to do, rather than sent to the bucket as credentials.
    pub async fn remote_conf(&self, name: &str) -> Result<Option<(tidemark_core::remote::RemoteConf, u64)>, CmdError> {
        use tidemark_core::remote::{RemoteConf, SECRET_SETTINGS, system_paths};
        let path = system_paths::remote_conf(name);
        let cluster = match &self.http {
            Some(h) => h.with_local_cluster_token().await,
            None => None,
        };
        let found = match &cluster {
            Some(c) => tidemark_engine::docs::read_json::<RemoteConf>(c, &path).await?,
            None => tidemark_engine::docs::read_json::<RemoteConf>(&*self.filer, &path).await?,
        };
        if let Some((conf, _)) = &found
            && let Some(k) = SECRET_SETTINGS.iter().find(|k| conf.setting(k).is_some_and(|v| v.starts_with("****")))
        {
            return Err(CmdError::Failed(format!(
                "the filer shows this shell remote {name:?}'s {k} masked, and the shell needs it to reach the bucket: \
                 run the shell on the server's machine as the user who owns its data directory (it then reads \
                 cluster.token there), or give it the cluster token (--token, TIDEMARK_TOKEN)"
            )));
        }
        Ok(found)
    }
}

/// Where the admin is, and its token.
#[derive(Clone, Debug)]
pub struct AdminRef {
    pub addr: String,
    pub token: Option<String>,
}

pub type Out<'a> = &'a mut (dyn Write + Send);
pub type CmdFuture<'a> = Pin<Box<dyn Future<Output = Result<(), CmdError>> + Send + 'a>>;

#[derive(Debug)]
pub enum CmdError {
    /// The command was called wrongly: the message is followed by the command's usage.
    Usage(String),
    /// The command ran and failed.
    Failed(String),
}

impl From<tidemark_core::Error> for CmdError {
    fn from(e: tidemark_core::Error) -> Self {
        CmdError::Failed(e.to_string())
    }
}

impl From<std::io::Error> for CmdError {
    fn from(e: std::io::Error) -> Self {
        CmdError::Failed(e.to_string())
    }
}

pub struct Command {
    pub name: &'static str,
    /// The synopsis after the name, e.g. `[-l] [PATH]`.
    pub synopsis: &'static str,
    pub summary: &'static str,
    /// More text for `help CMD`.
    pub details: &'static str,
    pub flags: &'static [FlagSpec],
    /// How many positional arguments the command takes (min, max).
    pub positional: (usize, usize),
    pub run: for<'a> fn(&'a Context, Args, Out<'a>) -> CmdFuture<'a>,
}

impl Command {
    pub fn usage(&self) -> String {
        let mut s = format!("usage: {} {}\n  {}\n", self.name, self.synopsis, self.summary);
        if !self.details.is_empty() {
            s.push_str(&format!("\n{}\n", self.details));
        }
        if !self.flags.is_empty() {
            s.push_str("\nflags:\n");
            for f in self.flags {
                let arg = match f.kind {
                    flags::FlagKind::Bool => String::new(),
                    flags::FlagKind::Value => "=VALUE".into(),
                };
                s.push_str(&format!("  -{}{arg}\n      {}\n", f.name, f.help));
            }
        }
        s
    }
}

pub fn find(name: &str) -> Option<&'static Command> {
    commands::ALL.iter().find(|c| c.name == name)
}

fn help_text(topic: Option<&str>) -> Result<String, String> {
    match topic {
        Some(name) => {
            find(name).map(Command::usage).ok_or_else(|| format!("no command {name:?}; run `help` for the list"))
        }
        None => {
            let mut s = String::from("commands:\n");
            for c in commands::ALL {
                s.push_str(&format!("  {:<22} {}\n", c.name, c.summary));
            }
            s.push_str("  help [CMD]             this list, or one command's usage\n");
            s.push_str(
                "\nFlags take Go style: -dir=/x, -dir /x and --dir=/x are the same. Separate commands with `;`.\n",
            );
            Ok(s)
        }
    }
}

/// Runs one command; on error, prints it (and the usage, for a usage error) to `err`.
pub async fn run_words(ctx: &Context, words: &[String], out: Out<'_>, err: &mut dyn Write) -> bool {
    let Some((name, rest)) = words.split_first() else { return true };
    if name == "help" {
        return match help_text(rest.first().map(String::as_str)) {
            Ok(text) => {
                let _ = out.write_all(text.as_bytes());
                true
            }
            Err(msg) => {
                let _ = writeln!(err, "error: {msg}");
                false
            }
        };
    }
    let Some(cmd) = find(name) else {
        let _ = writeln!(err, "error: unknown command {name:?}\n");
        let _ = err.write_all(help_text(None).unwrap_or_default().as_bytes());
        return false;
    };
    let result = match flags::parse(cmd.flags, rest) {
        Err(msg) => Err(CmdError::Usage(msg)),
        Ok(args) if args.positional.len() < cmd.positional.0 => Err(CmdError::Usage("missing argument".into())),
        Ok(args) if args.positional.len() > cmd.positional.1 => {
            Err(CmdError::Usage(format!("unexpected argument {:?}", args.positional[cmd.positional.1])))
        }
        Ok(args) => (cmd.run)(ctx, args, out).await,
    };
    match result {
        Ok(()) => true,
        Err(CmdError::Usage(msg)) => {
            let _ = writeln!(err, "error: {}: {msg}\n{}", cmd.name, cmd.usage());
            false
        }
        Err(CmdError::Failed(msg)) => {
            let _ = writeln!(err, "error: {}: {msg}", cmd.name);
            false
        }
    }
}

/// Runs every command of `line`, stopping at the first failure; returns whether all succeeded.
pub async fn run_line(ctx: &Context, line: &str, out: Out<'_>, err: &mut dyn Write) -> bool {
    let commands = match lex::split_line(line) {
        Ok(c) => c,
        Err(msg) => {
            let _ = writeln!(err, "error: {msg}");
            return false;
        }
    };
    for words in commands {
        let ok = run_words(ctx, &words, &mut *out, &mut *err).await;
        let _ = out.flush();
        if !ok {
            return false;
        }
    }
    true
}

/// The shell's entry point; returns the process exit code.
pub async fn main(ctx: Context, one_shot: Option<String>) -> i32 {
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    if let Some(line) = one_shot {
        return if run_line(&ctx, &line, &mut stdout, &mut stderr).await { 0 } else { 1 };
    }
    if !std::io::stdin().is_terminal() {
        // A script on stdin: run it line by line, stopping at the first failure.
        let mut input = String::new();
        if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input) {
            eprintln!("error: reading commands from stdin: {e}");
            return 1;
        }
        for line in input.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !run_line(&ctx, line, &mut stdout, &mut stderr).await {
                return 1;
            }
        }
        return 0;
    }
    interactive(ctx).await
}

async fn interactive(ctx: Context) -> i32 {
    use rustyline::error::ReadlineError;
    let mut editor = match rustyline::DefaultEditor::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot start the line editor: {e}");
            return 1;
        }
    };
    let history = std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".tidemark_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    match ctx.filer.health().await {
        Ok(h) => {
            println!("tidemark shell — filer {} (store {}). `help` lists commands, `exit` leaves.", h.version, h.store)
        }
        Err(e) => eprintln!("warning: {e}"),
    }
    loop {
        match editor.readline("> ") {
            Ok(line) => {
                let trimmed = line.trim();
                if trimmed.is_empty() {
                    continue;
                }
                let _ = editor.add_history_entry(trimmed);
                if matches!(trimmed, "exit" | "quit") {
                    break;
                }
                run_line(&ctx, trimmed, &mut std::io::stdout(), &mut std::io::stderr()).await;
            }
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                eprintln!("error: {e}");
                break;
            }
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    0
}
