//! `tidemark-fsx`: the file exerciser (`tidemark_testkit::fsx`) from the command line, for long
//! runs by hand on a mount (or any file system, to compare).

use std::process::ExitCode;

const USAGE: &str = "usage: tidemark-fsx [options] FILE

Exercises FILE (created or emptied, unless -k) with random reads, writes, truncates, mapped reads and
writes, copy_file_range, fallocate modes, fsync and reopens, checking every size and byte
against a model. On a failure it prints the seed and the operations before it, and exits 1.

options:
  -N OPS          operations to do (default 10000)
  -S SEED         the run's seed (default 1); a seed replays the same run
  -l LEN          the file's largest size in bytes (default 262144)
  -o LEN          the longest read, write or copy (default 65536)
  -R              no mapped reads or writes (mmap)
  -C              no copy_file_range
  -F              no fallocate
  -c N            close and reopen about once in N operations (default 500; 0: never)
  -v N            compare the whole file every N operations (default 1000; 0: only at the end)
  -Z              O_DIRECT reads and writes, in whole 4 KiB blocks (no mmap then)
  -k              keep FILE's bytes: start from what it holds (it must exist)
  --strict        a mode the file system refuses (EOPNOTSUPP) is a failure
";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut cfg = tidemark_testkit::fsx::Config::new("", 1, 10_000);
    let mut path = None;
    let num = |v: Option<String>, what: &str| -> Result<u64, String> {
        let v = v.ok_or_else(|| format!("{what} needs a value"))?;
        v.parse::<u64>().map_err(|_| format!("{what} {v:?}: not a number"))
    };
    let parsed: Result<(), String> = (|| {
        while let Some(a) = args.next() {
            match a.as_str() {
                "-h" | "--help" => {
                    print!("{USAGE}");
                    std::process::exit(0);
                }
                "-N" => cfg.ops = num(args.next(), "-N")?,
                "-S" => cfg.seed = num(args.next(), "-S")?,
                "-l" => cfg.max_len = num(args.next(), "-l")?.max(1),
                "-o" => cfg.max_op = num(args.next(), "-o")?.max(1),
                "-c" => cfg.reopen_every = num(args.next(), "-c")?,
                "-v" => cfg.verify_every = num(args.next(), "-v")?,
                "-R" => cfg.mmap = false,
                "-C" => cfg.copy_range = false,
                "-F" => cfg.fallocate = false,
                "-k" => cfg.keep = true,
                "-Z" => cfg.direct = true,
                "--strict" => cfg.require_all = true,
                f if f.starts_with('-') => return Err(format!("unknown option {f}")),
                p if path.is_none() => path = Some(p.to_string()),
                p => return Err(format!("one file only ({p:?} is a second)")),
            }
        }
        Ok(())
    })();
    if let Err(e) = parsed {
        eprint!("tidemark-fsx: {e}\n\n{USAGE}");
        return ExitCode::from(2);
    }
    let Some(path) = path else {
        eprint!("tidemark-fsx: which file?\n\n{USAGE}");
        return ExitCode::from(2);
    };
    cfg.path = path.into();
    let started = std::time::Instant::now();
    match tidemark_testkit::fsx::run(&cfg) {
        Ok(report) => {
            println!(
                "tidemark-fsx: seed {}: {report} in {:.1?}: all sizes and bytes right",
                cfg.seed,
                started.elapsed()
            );
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprint!("{f}");
            ExitCode::from(1)
        }
    }
}
