//! Hex strings: digests shown as text, and the random ids of blobs, cache files, clusters and
//! multipart uploads.

use crate::error::{Error, Result};

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|x| format!("{x:02x}")).collect()
}

/// `n` random bytes as hex; `what` names the id in the error (the OS gave no randomness).
pub fn random_hex(n: usize, what: &str) -> Result<String> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| Error::internal(format!("no randomness for {what}: {e}")))?;
    Ok(hex(&b))
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_and_random_ids() {
        assert_eq!(super::hex(&[0, 15, 255]), "000fff");
        let a = super::random_hex(16, "a test").unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, super::random_hex(16, "a test").unwrap());
    }
}
