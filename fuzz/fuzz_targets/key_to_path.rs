//! The key mapping on arbitrary keys: never panics, and an accepted key stays inside the mount
//! and maps back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_core::keymap::{KeyMap, Mapped};
use tidemark_core::path;

fuzz_target!(|key: &[u8]| {
    let map = KeyMap::new("/mnt/data", "photos").expect("a valid mount");
    if let Ok(mapped) = map.key_to_path(key) {
        let p = mapped.path();
        assert!(path::validate(p).is_ok());
        assert!(path::is_within(p, "/mnt/data") && p != "/mnt/data");
        let back = map.path_to_key(p, matches!(mapped, Mapped::DirMarker(_))).expect("maps back");
        assert_eq!(back.as_bytes(), key);
    }
});
