//! Tidemark's benchmarks, in a binary of their own (`tidemark-bench`) so that the product
//! binary carries none of their code or dependencies. Each prints its figures beside the limit
//! it is measured against in the same run; `scripts/bench.sh` runs them all, and
//! docs/BENCHMARKS.md records the latest numbers with the commands that produced them.

pub mod bench;
mod bench_apply;
mod bench_blobs;
mod bench_cache;
mod bench_gateway;
mod bench_mount;
mod bench_mount_remote;
mod bench_s3;
