//! `tidemark-bench`: Tidemark's benchmarks. See `tidemark-bench --help` and docs/BENCHMARKS.md.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "tidemark-bench",
    version,
    about = "Tidemark's benchmarks: each figure beside its limit, measured in the same run (docs/BENCHMARKS.md)."
)]
struct Cli {
    #[command(subcommand)]
    bench: tidemark_bench::bench::Bench,
}

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    std::process::exit(runtime.block_on(tidemark_bench::bench::run(cli.bench)));
}
