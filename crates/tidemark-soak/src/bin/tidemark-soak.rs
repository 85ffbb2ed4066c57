//! `tidemark-soak`: runs the soak under faults (see the crate's documentation) and prints its
//! figures; exits 1 if anything was lost, clobbered or left diverged, or the cluster did not
//! converge. `scripts/soak.sh MINUTES` builds and runs it.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Parser)]
#[command(name = "tidemark-soak", about = "A whole Tidemark cluster on this machine, under faults, then checked")]
struct Args {
    /// How long to inject faults while the mutator works.
    #[arg(long, value_name = "MINUTES", default_value_t = 2.0)]
    minutes: f64,
    /// The tidemark binary (default: the one beside this program).
    #[arg(long, value_name = "PATH")]
    tidemark: Option<PathBuf>,
    /// A fault every this many seconds, on average.
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    fault_every: f64,
    /// How long the cluster may take to converge after the last fault.
    #[arg(long, value_name = "SECS", default_value_t = 180)]
    converge_within: u64,
    /// Seeds the mutator's and the injector's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() {
    let a = Args::parse();
    let tidemark = a.tidemark.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("tidemark")))
            .unwrap_or_else(|| "tidemark".into())
    });
    let cfg = tidemark_soak::SoakConfig {
        duration: Duration::from_secs_f64(a.minutes * 60.0),
        tidemark,
        fault_every: Duration::from_secs_f64(a.fault_every),
        converge_within: Duration::from_secs(a.converge_within),
        seed: a.seed,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    eprintln!("soak: {:.1} minutes of faults every ~{:.1} s (seed {})", a.minutes, a.fault_every, a.seed);
    let started = std::time::Instant::now();
    match runtime.block_on(tidemark_soak::run(cfg)) {
        Ok(report) => {
            println!("{report}");
            println!("(soak took {:.0} s in all)", started.elapsed().as_secs_f64());
            std::process::exit(if report.ok() { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("error: the soak could not run: {e}");
            std::process::exit(2);
        }
    }
}
