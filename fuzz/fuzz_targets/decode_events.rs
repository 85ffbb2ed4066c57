//! Every decoder on arbitrary input: none may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_core::events::{azure, gcs, s3};

fuzz_target!(|data: &[u8]| {
    let _ = s3::decode(data);
    let _ = azure::decode(data);
    // Attributes from the first half (as `k=v` lines), data from the second.
    let (head, tail) = data.split_at(data.len() / 2);
    let attrs = String::from_utf8_lossy(head)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    let _ = gcs::decode(&attrs, tail);
});
